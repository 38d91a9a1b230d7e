"""Repeated fits in one process under MirroredStrategies of 2 then 4 then 2 devices. Used by test_strategy.py.

Real default cross-device ops (collectives), as a notebook gets them: TensorFlow numbers every
MirroredStrategy's collective groups from 1, so without distinct keys the second size aborts.
Prints one JSON line: the losses of each fit, and the error for user-made strategies that clash.
"""

import json

from start import arguments, start

arguments(__doc__)
start(cpus=4)

import tensorflow as tf  # noqa: E402
from tiny import tiny_data, tiny_model  # noqa: E402

from trainer import Trainer, resolve_strategy  # noqa: E402

x, y, w = tiny_data(203)
two = ["/cpu:0", "/cpu:1"]
losses = {"1": Trainer(strategy="default", batch_size=32, lr_scaling=None, verbose=0).fit(
    tiny_model(), (x, y), epochs=2).history["loss"]}
trainer = Trainer(strategy=resolve_strategy("mirrored", devices=two), batch_size=32, lr_scaling=None, verbose=0)
losses["2"] = trainer.fit(tiny_model(), (x, y), epochs=2).history["loss"]
losses["4"] = Trainer(strategy="mirrored", batch_size=32, lr_scaling=None, verbose=0).fit(
    tiny_model(), (x, y), epochs=2).history["loss"]
losses["4 again, by name in fit"] = trainer.fit(tiny_model(), (x, y), epochs=2, strategy="mirrored").history["loss"]
losses["2 again"] = trainer.fit(tiny_model(), (x, y), epochs=2).history["loss"]

# Strategies made by the user share TensorFlow's default keys: the second size is refused up front.
user_two = tf.distribute.MirroredStrategy(two)
losses["user 2"] = Trainer(strategy=user_two, batch_size=32, lr_scaling=None, verbose=0).fit(
    tiny_model(), (x, y), epochs=2).history["loss"]
error = None
try:
    Trainer(strategy=tf.distribute.MirroredStrategy(), batch_size=32, verbose=0).fit(tiny_model(), (x, y))
except ValueError as err:
    error = str(err)
losses["user 2 after the refusal"] = Trainer(strategy=user_two, batch_size=32, lr_scaling=None, verbose=0).fit(
    tiny_model(), (x, y), epochs=2).history["loss"]
print(json.dumps({"losses": losses, "error": error}))
