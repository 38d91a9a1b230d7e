"""Trains the tiny problem under STRATEGY and reports exact evaluation. Used by test_parameter_server.py.

Usage: python ps_run.py OUT_JSON STRATEGY [first]   (under `trainer-launch --workers 2 --ps 1` for
"parameter_server"; `first`: only the first fit, its evaluate and predict)
"""

import json
import sys

from start import arguments, start

args = arguments(__doc__, ("out", str), ("strategy", str), options=(("first", {"nargs": "?", "choices": ["first"]}),))
out, strategy = args.out, args.strategy
start()

from trainer import Trainer  # noqa: E402

trainer = Trainer(strategy=strategy, per_replica_batch_size=32, lr_scaling=None, seed=0, steps_per_execution=8)
from tiny import tiny_data, tiny_model  # noqa: E402

x, y, w = tiny_data(1003)
history = trainer.fit(lambda: tiny_model(lr=0.05), (x, y, w), epochs=4, validation_data=(x[:300], y[:300]))
evaluation = trainer.evaluate(history.model, (x, y, w), return_dict=True)
logits = trainer.predict(history.model, x)
if args.first:  # the first fit only (the scale test's 3 workers and 2 ps tasks)
    with open(out, "w") as f:
        json.dump({"history": history.history, "evaluate": evaluation, "logits": logits.tolist(),
                   "iterations": int(history.model.optimizer.iterations.numpy())}, f)
    sys.exit(0)
# A model without regularization losses: its steps return no regularization term of their own.
plain = trainer.fit(lambda: tiny_model(lr=0.05, regularized=False), (x, y, w), epochs=1, steps_per_epoch=8)
# Optimizer options that Keras applies inside a `cond` (accumulation, EMA overwrite), with global clipping.
options = dict(gradient_accumulation_steps=2, global_clipnorm=1.0, use_ema=True, ema_overwrite_frequency=3)
accumulated = trainer.fit(lambda: tiny_model(lr=0.05, **options), (x, y, w), epochs=1, steps_per_epoch=8)
# The user's own instance, built outside any scope: its variables live on the ps tasks during the fit.
import keras  # noqa: E402


class Devices(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.devices = sorted({v.value.device for v in self.model.weights})


instance, devices = tiny_model(lr=0.05), Devices()
trainer.fit(instance, (x, y, w), epochs=1, steps_per_epoch=8, callbacks=[devices])
with open(out, "w") as f:
    json.dump({"history": history.history, "evaluate": evaluation, "logits": logits.tolist(),
               "iterations": int(history.model.optimizer.iterations.numpy()),
               "plain_loss": plain.history["loss"],
               "accumulated": {"loss": accumulated.history["loss"],
                               "updates": int(accumulated.model.optimizer.iterations.numpy()),
                               "steps": int(accumulated.model.optimizer._iterations.numpy())},
               "instance": {"devices": devices.devices, "iterations": int(instance.optimizer.iterations.numpy()),
                            "home": [v.value.device for v in instance.weights]}}, f)
print("done")
