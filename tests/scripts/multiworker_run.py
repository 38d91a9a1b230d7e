"""Trains the equivalence problem under one device layout and saves what each task saw.

Usage: python multiworker_run.py OUT_DIR STRATEGY [backup | epoch-backup]
Run once without TF_CONFIG for the single-process reference, or under
trainer-launch for the multi-worker run. Environment: REPLICAS (CPU replicas
of a single process), KILL_TASK or KILL_NODE (a task, e.g. worker1, whose
process or launcher dies at epoch 1, step 8), TERM_TASK (a task sent SIGTERM
at step 4), HOLD (every task waits at epoch 1, step 8 for SIGTERM, unless
Slurm restarted the job), EPOCHS (default 2). Each task writes
OUT_DIR/task<id>.npz and OUT_DIR/task<id>.json; chief-only files go to
OUT_DIR/files.
"""

import json
import os

from start import arguments, start

args = arguments(__doc__, ("out", str), ("strategy", str),
                 options=(("backup", {"nargs": "?", "choices": ["backup", "epoch-backup"]}),))
out, strategy = args.out, args.strategy
# REPLICAS: a single process of several CPU replicas, e.g. to resume the workers' backup
start(cpus=int(os.environ.get("REPLICAS", 0)))

import numpy as np  # noqa: E402

from trainer import Trainer, cluster_info  # noqa: E402

# Multi-worker strategies must exist before TensorFlow runs anything, so the Trainer comes first.
trainer = Trainer(strategy=strategy, batch_size=64, lr_scaling=None, seed=0, steps_per_execution=4)
from tiny import tiny_data, tiny_model  # noqa: E402

import keras  # noqa: E402

from trainer.callbacks import BackupAndRestore, JSONLogger, ModelCheckpoint  # noqa: E402

files = os.path.join(out, "files")
x, y, w = tiny_data(1003)
callbacks = [JSONLogger(os.path.join(files, "log.jsonl")), ModelCheckpoint(os.path.join(files, "ckpt"))]
if args.backup == "backup":
    callbacks.append(BackupAndRestore(os.path.join(files, "backup"), save_freq=4))
if args.backup == "epoch-backup":  # backups at epoch ends only, and where a SIGTERM stops training
    callbacks.append(BackupAndRestore(os.path.join(files, "backup")))
info = cluster_info()
task = f"{info.task_type or 'single'}{info.task_id}"
if task in (os.environ.get("KILL_TASK"), os.environ.get("KILL_NODE"), os.environ.get("TERM_TASK")):
    import signal

    # At epoch 1, step 8. KILL_TASK: the worker dies. KILL_NODE: its launcher dies, and the worker with it: a
    # machine gone. TERM_TASK, at step 4: the worker alone is told to stop (SIGTERM), as a preempted machine's
    # would be; it acts on it at the next boundary, step 8, where it names the one after (step 12).
    victim = os.getppid() if os.environ.get("KILL_NODE") == task else os.getpid()
    signum = signal.SIGTERM if os.environ.get("TERM_TASK") == task else signal.SIGKILL
    at = (1, 4) if signum == signal.SIGTERM else (1, 8)

    class Die(keras.callbacks.Callback):
        handles_fused_steps = True

        def set_trainer_context(self, context):
            self.context, self.sent = context, False

        def on_train_batch_end(self, batch, logs=None):
            if not self.sent and (self.context.epoch, self.context.step) >= at:
                self.sent = True
                os.kill(victim, signum)

    callbacks.append(Die())
if os.environ.get("HOLD") and not os.environ.get("SLURM_RESTART_COUNT"):  # a long run, which a scheduler stops
    import signal
    import time

    class Hold(keras.callbacks.Callback):
        """At epoch 1, step 8 (the first run only): says so in OUT_DIR/holding-<task>, and waits for SIGTERM,
        which then reaches the handler that was there (the trainer's BackupAndRestore's)."""

        handles_fused_steps = True

        def set_trainer_context(self, context):
            self.context, self.held = context, False

        def on_train_batch_end(self, batch, logs=None):
            if self.held or (self.context.epoch, self.context.step) < (1, 8):
                return
            self.held, released = True, []
            previous = signal.getsignal(signal.SIGTERM)

            def release(signum, frame):
                released.append(signum)
                if callable(previous):
                    previous(signum, frame)

            signal.signal(signal.SIGTERM, release)
            open(os.path.join(out, f"holding-{task}"), "w").close()
            deadline = time.monotonic() + 120
            while not released and time.monotonic() < deadline:
                time.sleep(0.05)

    callbacks.append(Hold())


class Replicas(keras.callbacks.Callback):
    """The replicas in sync and the chief, as this task's fit saw them (its TrainContext)."""

    def set_trainer_context(self, context):
        self.context = context

    def on_train_begin(self, logs=None):
        self.seen = {"replicas": self.context.plan.num_replicas, "is_chief": self.context.is_chief}


replicas = Replicas()
callbacks.append(replicas)
epochs = int(os.environ.get("EPOCHS", "2"))
# Global clipping and gradient accumulation: exact only if applied to the workers' summed gradient.
# Each task builds its own instance, outside any scope, seeded by its task id: the moved variables
# start from the chief's values, so every worker trains what the single process (seed 0) trains.
model = tiny_model(seed=info.task_id or 0, global_clipnorm=0.5, gradient_accumulation_steps=2)
history = trainer.fit(model, (x, y, w), epochs=epochs,
                      validation_data=(x[:301], y[:301], w[:301]),
                      callbacks=callbacks)
assert history.model is model
evaluation = trainer.evaluate(history.model, (x, y, w), return_dict=True)
predictions = trainer.predict(history.model, x)
np.savez(os.path.join(out, f"{task}.npz"), predictions=predictions,
         weights=np.concatenate([v.ravel() for v in history.model.get_weights()]))
with open(os.path.join(out, f"{task}.json"), "w") as f:
    json.dump({"history": history.history, "evaluate": evaluation, "epochs": history.epoch, **replicas.seen}, f)
print("done", task)
