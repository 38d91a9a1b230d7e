"""Fits on 2 CPU replicas from a PyDataset whose batches are views of arrays in memory; prints whether the
arrays stayed as they were. Used by test_user_memory.py.

Usage: python user_memory_run.py FITS
"""

import json

from start import arguments, start

args = arguments(__doc__, ("fits", int))
start(cpus=2)

import numpy as np  # noqa: E402

import keras  # noqa: E402

from trainer import Trainer  # noqa: E402


class Slices(keras.utils.PyDataset):
    """Batches that are views of the arrays, as a PyDataset over arrays in memory yields them."""

    def __init__(self, x, y, batch):
        super().__init__()
        self.x, self.y, self.batch = x, y, batch

    def __len__(self):
        return len(self.x) // self.batch

    def __getitem__(self, i):
        rows = slice(i * self.batch, (i + 1) * self.batch)
        return self.x[rows], self.y[rows]


rng = np.random.default_rng(0)
x = rng.normal(size=(2048, 32)).astype("float32")
y = (x[:, :4].sum(axis=1) > 0).astype("float32")
before = x.copy(), y.copy()
trainer = Trainer(strategy="mirrored", batch_size=64, lr_scaling=None, verbose=0, steps_per_execution=1)
changed = []
for _ in range(args.fits):
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    trainer.fit(model, Slices(x, y, 64), epochs=2, shuffle=False)
    changed.append(int((x != before[0]).sum() + (y != before[1]).sum()))
print(json.dumps({"values_changed": changed}))
