"""Trains with BackupAndRestore; optionally kills itself mid-epoch. Used by test_backup.py.

The data are shuffled each epoch and the model counts how often it trained on each example.
FORM=batched or FORM=pydataset gives fit the same data as a batched tf.data.Dataset or a
PyDataset (unshuffled), whose batches of 16 are the global batches.

Usage: python backup_run.py BACKUP_DIR OUT_NPZ [kill|term EPOCH STEP | kill-at-epoch-end EPOCH]
Environment: REPLICAS (default 2), DROPOUT (default 0.3), BATCH=global for a global batch of 16 on any layout.
Exit status: 0 when training completed; killed runs die by SIGKILL, SIGTERM runs exit 143.
"""

import os
import signal

from start import arguments, start

args = arguments(__doc__, ("backup_dir", str), ("out", str), ("fault", str, "*"))
backup_dir, out = args.backup_dir, args.out
REPLICAS = int(os.environ.get("REPLICAS", "2"))  # another count when a test resumes on another layout
start(cpus=REPLICAS)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer.callbacks import BackupAndRestore, JSONLogger  # noqa: E402
from trainer import Trainer  # noqa: E402


class KillAt(keras.callbacks.Callback):
    """Sends itself a signal at the first step boundary at or after (epoch, step)."""

    handles_fused_steps = True

    def __init__(self, how, epoch, step):
        super().__init__()
        self.signal = signal.SIGKILL if how == "kill" else signal.SIGTERM
        self.at, self.sent = (epoch, step), False

    def set_trainer_context(self, context):
        self.context = context

    def on_train_batch_end(self, batch, logs=None):
        if not self.sent and (self.context.epoch, self.context.step) >= self.at:
            self.sent = True
            os.kill(os.getpid(), self.signal)


class CountExamples(keras.layers.Layer):
    """Strips the example-id column and counts, per id, how often training saw the example.

    The counts are a model variable, so backups save and restore them: after a resumed
    run every count equals the epochs only if no example was skipped or repeated.
    """

    def __init__(self, num_examples, **kwargs):
        super().__init__(**kwargs)
        self.num_examples = num_examples
        self.counts = self.add_weight(shape=(num_examples,), initializer="zeros", trainable=False,
                                      aggregation="sum", name="counts")  # replicas' counts add up

    def call(self, inputs, training=False):
        if training:
            ids = tf.cast(inputs[:, -1], "int32")
            # tf.Variable.assign_add: Keras's assign_add is assign(self + delta), which SUM aggregation would
            # add up over the replicas along with the deltas.
            self.counts.value.assign_add(tf.math.bincount(ids, minlength=self.num_examples,
                                                    maxlength=self.num_examples, dtype="float32"))
        return inputs[:, :-1]


def build():
    inputs = keras.Input((9,))
    hidden = keras.layers.Dense(32, activation="relu")(CountExamples(len(x))(inputs))
    # Random state must survive the restart (DROPOUT=0: none, in the runs compared across layouts, written before
    # the trainer gave every layout one device's masks; soak_run.py resumes with dropout on another layout).
    hidden = keras.layers.Dropout(float(os.environ.get("DROPOUT", "0.3")), seed=1)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


rng = np.random.default_rng(0)
x = rng.normal(size=(250, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
x = np.concatenate([x, np.arange(len(x), dtype="float32")[:, None]], axis=1)  # the last column: example id
class KillAtEpochEnd(keras.callbacks.Callback):
    """SIGKILLs the process in `on_epoch_end` of `epoch`: after the backup's hook, before the logger's."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = [BackupAndRestore(backup_dir, save_freq=5), JSONLogger(os.path.join(backup_dir, "..", "log.jsonl"))]
if args.fault[:1] == ["kill-at-epoch-end"]:
    callbacks.insert(1, KillAtEpochEnd(int(args.fault[1])))
elif args.fault:
    callbacks.insert(0, KillAt(args.fault[0], int(args.fault[1]), int(args.fault[2])))



class Batches(keras.utils.PyDataset):
    """The arrays in batches of 16, read by two worker threads."""

    def __init__(self):
        super().__init__(workers=2)

    def __len__(self):
        return -(-len(x) // 16)

    def __getitem__(self, i):
        return x[i * 16:(i + 1) * 16], y[i * 16:(i + 1) * 16]


FORM = os.environ.get("FORM", "arrays")  # how fit reads the data; the batched forms' batches are the global batches
data = {"arrays": lambda: (x, y), "batched": lambda: tf.data.Dataset.from_tensor_slices((x, y)).batch(16),
        "pydataset": Batches}[FORM]()
# BATCH=global: a global batch of 16 on any layout; else 8 per replica (16 on 2 replicas).
batch = {"batch_size": 16} if os.environ.get("BATCH") == "global" else {"per_replica_batch_size": 8}
trainer = Trainer(strategy="mirrored", steps_per_execution=4, seed=3, verbose=0, **batch)
history = trainer.fit(build, data, epochs=3, callbacks=callbacks, shuffle=FORM == "arrays")
np.savez(out, *history.model.get_weights())
counts = next(layer for layer in history.model.layers if isinstance(layer, CountExamples)).counts
np.save(out.replace(".npz", "_counts.npy"), np.asarray(counts.numpy()))
print("completed", history.epoch)
