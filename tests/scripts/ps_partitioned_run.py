"""Fits a model instance under ParameterServerStrategy, with or without a variable partitioner; saves the result.

Usage: python ps_partitioned_run.py OUT.npz PARTITIONED   (under `trainer-launch --workers 1 --ps 2`)
  PARTITIONED: "1" for MinSizePartitioner(min_shard_bytes=64, max_shards=2), "0" for none.

With one worker the scheduled steps run one after another, in the order of
the data, so the two runs must give the same numbers. The model has an
Embedding (a sparse gradient, split over the shards), Dense layers, and AdamW
(its weight decay and slots go through the strategy's update path too); a
BackupAndRestore reads every variable after each epoch. A second model
accumulates gradients and overwrites its weights with their EMA.
"""

import json
import tempfile

from start import arguments, start

args = arguments(__doc__, ("out", str), options=(("partitioned", {"choices": ["0", "1"]}),))
out, partitioned = args.out, args.partitioned == "1"
start()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.callbacks import BackupAndRestore  # noqa: E402

partitioner = (tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=64, max_shards=2)
               if partitioned else None)
strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver(),
                                                 variable_partitioner=partitioner)
trainer = Trainer(strategy=strategy, batch_size=16, lr_scaling=None, shuffle=False, steps_per_execution=1)

import keras  # noqa: E402


class Placement(keras.callbacks.Callback):
    """Where each weight lives during the fit: the devices of its shards (one device when whole)."""

    def on_train_begin(self, logs=None):
        self.devices = {}
        for v in self.model.weights:
            parts = getattr(v.value, "variables", [v.value])
            self.devices[v.path] = [part.device for part in parts]


rng = np.random.default_rng(0)
x = rng.integers(1, 50, size=(200, 6))
y = (x[:, 0] > 25).astype("int64") + (x[:, 1] > 40).astype("int64")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(50, 8),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(3)])
model.compile(keras.optimizers.AdamW(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
placement = Placement()
with tempfile.TemporaryDirectory() as backup:
    history = trainer.fit(model, x, y, epochs=3, callbacks=[placement, BackupAndRestore(backup)])
evaluation = trainer.evaluate(model, x, y, return_dict=True)
predictions = trainer.predict(model, x)
# Gradient accumulation and EMA overwrite, which Keras's optimizer updates through the same path.
accumulating = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
options = dict(gradient_accumulation_steps=2, use_ema=True, ema_overwrite_frequency=3)
accumulating.compile(keras.optimizers.Adam(0.01, **options),
                     keras.losses.SparseCategoricalCrossentropy(from_logits=True))
trainer.fit(accumulating, x.astype("float32") / 50, y, epochs=1, verbose=0)
arrays = model.get_weights() + [v.numpy() for v in model.optimizer.variables] + accumulating.get_weights()
np.savez(out, predictions=predictions, *arrays, *[v.numpy() for v in accumulating.optimizer.variables])
with open(out + ".json", "w") as f:
    json.dump({"history": history.history, "evaluate": evaluation, "devices": placement.devices,
               "iterations": int(model.optimizer.iterations.numpy()),
               "home": sorted({v.value.device for v in model.weights})}, f)
print("done", flush=True)
