"""Trains on a tf.data pipeline that reshuffles each pass, with BackupAndRestore; optionally SIGKILLs itself
mid-epoch. Used by test_reshuffle_resume.py.

700 examples in global batches of 70, Adam, a backup every 3 steps (issue 74's setting). The model counts how
often it trained on each example (a model variable, which the backup holds), and the chief writes the counts
at every epoch's end: after epoch e, a whole run has read every example e + 1 times (a stream, as the
uninterrupted run read it).

PIPE (the pipeline):
  unseeded   from_tensor_slices((x, y)).shuffle(700), batched by the trainer
  seeded     the same with shuffle(700, seed=3)
  batched    shuffle(700, seed=3).batch(70): the batches are the global batches
  ops        cache, map, filter, interleave, shuffle(seed=3) and prefetch, batched by the trainer
  function   a dataset function (input_context) that shuffles with a seed and batches per replica
  stream     filter(...).shuffle(700, seed=3).repeat().batch(70), with steps_per_epoch=10

Usage: python reshuffle_run.py BACKUP_DIR OUT_NPZ [EPOCH STEP]   (kill at the first boundary at or after it)
Environment: PIPE (default seeded), REPLICAS (default 2), EPOCHS (default 3), BACKUP=0 (no BackupAndRestore).
"""

import os
import signal

from start import arguments, start

args = arguments(__doc__, ("backup_dir", str), ("out", str), ("kill", int, "*"))
REPLICAS = int(os.environ.get("REPLICAS", "2"))
start(cpus=REPLICAS)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.callbacks import BackupAndRestore, ChiefOnly  # noqa: E402

PIPE, EPOCHS, N = os.environ.get("PIPE", "seeded"), int(os.environ.get("EPOCHS", "3")), 700
strategy = tf.distribute.MultiWorkerMirroredStrategy() if "TF_CONFIG" in os.environ else None


class Counts(keras.layers.Layer):
    """Strips the example-id column and counts how often training saw each example (summed over replicas)."""

    def build(self, shape):
        self.counts = self.add_weight(shape=(N,), initializer="zeros", trainable=False, aggregation="sum",
                                      name="counts")

    def call(self, inputs, training=False):
        if training:
            ids = tf.cast(inputs[:, -1], "int32")
            self.counts.value.assign_add(tf.math.bincount(ids, minlength=N, maxlength=N, dtype="float32"))
        return inputs[:, :-1]


class KillAt(keras.callbacks.Callback):
    handles_fused_steps = True

    def __init__(self, epoch, step):
        super().__init__()
        self.at = (epoch, step)

    def set_trainer_context(self, context):
        self.context = context

    def on_train_batch_end(self, batch, logs=None):
        if (self.context.epoch, self.context.step) >= self.at:
            os.kill(os.getpid(), signal.SIGKILL)


class EpochCounts(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        layer = next(layer for layer in self.model.layers if isinstance(layer, Counts))
        np.save(args.out.replace(".npz", f"_counts{epoch}.npy"), np.asarray(layer.counts.numpy()))


def build():
    inputs = keras.Input((9,))
    hidden = keras.layers.Dense(16, activation="tanh")(Counts()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


rng = np.random.default_rng(0)
x = rng.normal(size=(N, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
x = np.concatenate([x, np.arange(N, dtype="float32")[:, None]], axis=1)  # the last column: the example's id
examples = tf.data.Dataset.from_tensor_slices((x, y))


def per_replica(context):
    batch = context.get_per_replica_batch_size(70)
    return (examples.shard(context.num_input_pipelines, context.input_pipeline_id).shuffle(700, seed=3)
            .batch(batch))


data = {
    "unseeded": lambda: examples.shuffle(700),
    "seeded": lambda: examples.shuffle(700, seed=3),
    "batched": lambda: examples.shuffle(700, seed=3).batch(70),
    "ops": lambda: examples.cache().map(lambda a, b: (a * 1.0, b), num_parallel_calls=2)
    .filter(lambda a, b: a[-1] >= 0)
    .interleave(lambda a, b: tf.data.Dataset.from_tensors((a, b)), cycle_length=2, num_parallel_calls=2)
    .shuffle(700, seed=3).prefetch(2),
    "function": lambda: per_replica,
    "stream": lambda: examples.filter(lambda a, b: a[-1] % 7 != 0).shuffle(700, seed=3).repeat().batch(70),
}[PIPE]()
callbacks = [BackupAndRestore(args.backup_dir, save_freq=3), ChiefOnly(EpochCounts())]
if os.environ.get("BACKUP") == "0":  # the run without a backup, whose numbers the marked runs must keep
    callbacks = callbacks[1:]
if args.kill:
    callbacks.insert(0, KillAt(*args.kill))
trainer = Trainer(strategy=strategy or "mirrored", batch_size=70, seed=5, verbose=1, steps_per_execution=1)
history = trainer.fit(build, data, epochs=EPOCHS, callbacks=callbacks,
                      steps_per_epoch=10 if PIPE == "stream" else None)
if strategy is None or strategy.cluster_resolver.task_id == 0:
    np.savez(args.out, *history.model.get_weights())
print("history", {k: [round(float(v), 7) for v in vals] for k, vals in history.history.items()})
