"""Runs fit/evaluate/predict under one device layout and saves what came out.

Usage: python layout_run.py STRATEGY NUM_DEVICES OUT.npz
  STRATEGY: "none" (no strategy at all) or "mirrored" over NUM_DEVICES logical CPUs.
Each layout needs its own process: logical devices are fixed at TF start-up.
"""

import json

from start import arguments, start

args = arguments(__doc__, ("strategy", str), ("num_devices", int), ("out", str))
strategy_name, num_devices, out = args.strategy, args.num_devices, args.out
start(cpus=num_devices)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tiny import tiny_data, tiny_model  # noqa: E402

from trainer import Trainer  # noqa: E402

strategy = (
    tf.distribute.get_strategy()
    if strategy_name == "none"
    else tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(num_devices)])
)
x, y, w = tiny_data(1003)
trainer = Trainer(strategy=strategy, batch_size=64, lr_scaling=None, seed=0, verbose=0)

history = trainer.fit(tiny_model(), (x, y, w), epochs=2, validation_data=(x[:301], y[:301], w[:301]))
model = history.model
evaluation = trainer.evaluate(model, (x, y, w), return_dict=True)
predictions = trainer.predict(model, x)

# At LR 0 the weights never move, so the epoch loss must be the weighted mean.
frozen = tiny_model(lr=0.0)
frozen_history = Trainer(strategy=strategy, batch_size=64, lr_scaling=None, verbose=0).fit(frozen, (x, y, w), epochs=1)
frozen_logits = frozen.predict(x, verbose=0)

np.savez(
    out,
    weights=np.concatenate([v.ravel() for v in model.get_weights()]),
    predictions=predictions,
    frozen_logits=frozen_logits,
    frozen_reg=float(sum(frozen.losses)),
)
print(json.dumps({
    "history": history.history,
    "evaluate": evaluation,
    "frozen_loss": frozen_history.history["loss"][0],
    "replicas": strategy.num_replicas_in_sync,
}))
