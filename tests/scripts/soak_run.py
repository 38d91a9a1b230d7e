"""The job of the fault soak (soak.py): trains with a backup every few steps, and says where it is.

Usage: python soak_run.py OUT_DIR BACKUP_DIR
Environment: SOAK_DATA=reshuffled trains on a tf.data pipeline that reshuffles each pass (seeded), not arrays.
Run alone for the uninterrupted reference, or on every node under trainer-launch. The chief prints
`soak-begin EPOCH STEP` once training starts (after any resume) and `soak-step EPOCH STEP` at each step
boundary; it logs epochs to OUT_DIR/log.jsonl and, when training completes, writes OUT_DIR/result.npz: the
weights, the count of how often each example was trained on, and the optimizer's step count.
"""

import os

from start import arguments, start

args = arguments(__doc__, ("out", str), ("backup_dir", str))
out, backup_dir = args.out, args.backup_dir
start()

import numpy as np  # noqa: E402

from trainer import Trainer, cluster_info  # noqa: E402

EPOCHS, EXAMPLES, BATCH, SAVE_FREQ = 4, 960, 40, 4  # 24 steps an epoch; a backup every 4 steps and at epoch ends
# The global batch is fixed, so the job resumes exactly on 2 workers or on the 1 a lost node leaves.
trainer = Trainer(strategy="auto", batch_size=BATCH, lr_scaling=None, seed=5, steps_per_execution=1, verbose=0)

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer.callbacks import BackupAndRestore, JSONLogger  # noqa: E402


class CountExamples(keras.layers.Layer):
    """Strips the example-id column and counts, per id, how often training saw the example (a model variable,
    so backups carry it): after the job, every count equals the epochs only if no step ran twice or was lost."""

    def __init__(self, num_examples, **kwargs):
        super().__init__(**kwargs)
        self.counts = self.add_weight(shape=(num_examples,), initializer="zeros", trainable=False,
                                      aggregation="sum", name="counts")

    def call(self, inputs, training=False):
        if training:
            ids = tf.cast(inputs[:, -1], "int32")
            self.counts.value.assign_add(tf.math.bincount(ids, minlength=self.counts.shape[0],
                                                          maxlength=self.counts.shape[0], dtype="float32"))
        return inputs[:, :-1]


def build():
    # Wide layers: a backup of about 5 MB takes long enough to write that a kill can land inside it.
    # GELU, not ReLU: a job that changes layout sums its batches in another order, and a ReLU input within
    # that rounding of its kink takes the other side (docs/exactness.md, "Rounding"). With ReLU on TF 2.22, one
    # ulp added to the first kernel at step 8 of one process moved the final weights by 2.4e-3, the size of a
    # lost step; with GELU by 5e-8, on TF 2.21 and 2.22.
    keras.utils.set_random_seed(1)
    inputs = keras.Input((17,))
    hidden = keras.layers.Dense(640, activation="gelu")(CountExamples(EXAMPLES)(inputs))
    hidden = keras.layers.Dropout(0.2, seed=2)(hidden)
    hidden = keras.layers.Dense(640, activation="gelu")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.compile(keras.optimizers.Adam(1e-3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


class Progress(keras.callbacks.Callback):
    """The chief's position, line by line, for the soak to schedule its faults by."""

    handles_fused_steps = True

    def set_trainer_context(self, context):
        self.context = context

    def on_train_begin(self, logs=None):
        self._say("soak-begin")

    def on_train_batch_end(self, batch, logs=None):
        self._say("soak-step")

    def _say(self, what):
        if self.context.is_chief:
            print(what, self.context.epoch if what == "soak-step" else self.context.initial_epoch,
                  self.context.step if what == "soak-step" else self.context.initial_step, flush=True)


rng = np.random.default_rng(0)
x = rng.normal(size=(EXAMPLES + 200, 16)).astype("float32")
y = ((x[:, 0] > 0).astype("int64") + (x[:, 1] + x[:, 2] > 1).astype("int64"))
x_val, y_val = x[EXAMPLES:], y[EXAMPLES:]
x, y = x[:EXAMPLES], y[:EXAMPLES]
x = np.concatenate([x, np.arange(EXAMPLES, dtype="float32")[:, None]], axis=1)  # the last column: example id
x_val = np.concatenate([x_val, np.zeros((len(x_val), 1), "float32")], axis=1)

# Progress last: its `soak-begin` line names where the backup resumed training.
callbacks = [BackupAndRestore(backup_dir, save_freq=SAVE_FREQ), JSONLogger(os.path.join(out, "log.jsonl")), Progress()]
if os.environ.get("SOAK_DATA") == "reshuffled":  # soak.py --data reshuffled: the backups hold the pipeline's place
    data = (tf.data.Dataset.from_tensor_slices((x, y)).map(lambda a, b: (a * 1.0, b), num_parallel_calls=2)
            .shuffle(EXAMPLES, seed=7).prefetch(2),)
else:
    data = (x, y)
history = trainer.fit(build, *data, epochs=EPOCHS, validation_data=(x_val, y_val), callbacks=callbacks)
if cluster_info().is_chief:
    model = history.model
    counts = next(layer for layer in model.layers if isinstance(layer, CountExamples)).counts
    np.savez(os.path.join(out, "result.npz"), counts=np.asarray(counts.numpy()),
             iterations=np.asarray(model.optimizer.iterations.numpy()),
             **{f"weight_{i}": w for i, w in enumerate(model.get_weights())})
    print("soak-done", history.epoch, flush=True)
