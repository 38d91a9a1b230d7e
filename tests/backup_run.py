"""Trains with BackupAndRestore; optionally kills itself mid-epoch. Used by test_backup.py.

Usage: python backup_run.py BACKUP_DIR OUT_NPZ [kill|term EPOCH STEP]
Exit status: 0 when training completed; killed runs die by SIGKILL, SIGTERM runs exit 143.
"""

import os
import signal
import sys

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)
import keras  # noqa: E402

from callbacks import BackupAndRestore, JSONLogger  # noqa: E402
from trainer import Trainer  # noqa: E402

backup_dir, out = sys.argv[1], sys.argv[2]


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


def build():
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    hidden = keras.layers.Dropout(0.3, seed=1)(hidden)  # random state must survive the restart
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


rng = np.random.default_rng(0)
x = rng.normal(size=(250, 8)).astype("float32")
y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
callbacks = [BackupAndRestore(backup_dir, save_freq=5), JSONLogger(os.path.join(backup_dir, "..", "log.jsonl"))]
if len(sys.argv) > 3:
    callbacks.insert(0, KillAt(sys.argv[3], int(sys.argv[4]), int(sys.argv[5])))
trainer = Trainer(strategy="mirrored", per_replica_batch_size=8, steps_per_execution=4, seed=3, verbose=0)
history = trainer.fit(build, (x, y), epochs=3, callbacks=callbacks)
np.savez(out, *history.model.get_weights())
print("completed", history.epoch)
