"""Calls every entry of the trainer as a user would, on a platform it was not tested on; prints what happened.

Usage: python platform_run.py newer|moved|route [REPLICAS]

- newer: Keras reports version 3.17.0 (as after `pip install -U keras`), with the installed Keras's files.
- moved: the module of Keras's TF optimizer can no longer be imported by name (as if Keras had moved it), while
  Keras itself keeps the class it loaded.
- route: keras/src/backend/tensorflow/trainer.py, the route to the trainer's own steps, holds its class under
  neither name the trainer knows (as Keras 3.16's `Trainer` looked to a trainer that knew `TensorFlowTrainer`).

Each entry runs on the same two-Dense model, one after another: `Trainer.fit`, `evaluate` and `predict`, then
inside `Trainer.distribute()` the model's own fit, evaluate, predict and `*_on_batch`. Prints one JSON line,
entry -> {"refused": message or None, "plan": what it printed, "weights_changed": bool, "model_called": whether
anything ran the model}.
"""

import contextlib
import io
import json
import sys

from start import arguments, start

args = arguments(__doc__, options=(("mode", {"choices": ["newer", "moved", "route"]}),
                                   ("replicas", {"type": int, "nargs": "?", "default": 1})))
mode, replicas = args.mode, args.replicas
start(cpus=replicas if replicas > 1 else 0)

import keras  # noqa: E402
import numpy as np  # noqa: E402

if mode == "moved":  # Keras holds the module's classes already; a later import of the module by name fails
    import keras.src.backend.tensorflow.optimizer  # noqa: F401

    sys.modules["keras.src.backend.tensorflow.optimizer"] = None
elif mode == "route":  # the module is there, its trainer class under neither name the trainer knows
    import keras.src.backend.tensorflow.trainer as backend_trainer

    for name in ("TensorFlowTrainer", "Trainer"):
        vars(backend_trainer).pop(name, None)

from trainer import Trainer  # noqa: E402

if mode == "newer":  # after the trainer read which Keras layout this is: one that says 3.17.0
    keras.version = lambda: "3.17.0"

calls = []


class Counted(keras.layers.Dense):
    """A Dense layer that notes each time anything (Keras's loop or the trainer's) calls or traces it."""

    def call(self, inputs):
        calls.append(1)
        return super().call(inputs)


rng = np.random.default_rng(0)
x = rng.normal(size=(21, 3)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5]], "float32")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), Counted(4), keras.layers.Dense(1)])
model.compile(keras.optimizers.SGD(0.1), "mse")
trainer = Trainer(strategy="mirrored" if replicas > 1 else "default", batch_size=8, verbose=1)


def inside(method, *call_args, **kwargs):
    with trainer.distribute():
        return getattr(model, method)(*call_args, **kwargs)


ENTRIES = {
    "fit": lambda: trainer.fit(model, x, y, epochs=1),
    "evaluate": lambda: trainer.evaluate(model, x, y),
    "predict": lambda: trainer.predict(model, x),
    "distribute: fit": lambda: inside("fit", x, y, batch_size=8, epochs=1),
    "distribute: evaluate": lambda: inside("evaluate", x, y, batch_size=8),
    "distribute: predict": lambda: inside("predict", x, batch_size=8),
    "distribute: train_on_batch": lambda: inside("train_on_batch", x[:8], y[:8]),
    "distribute: test_on_batch": lambda: inside("test_on_batch", x[:8], y[:8]),
    "distribute: predict_on_batch": lambda: inside("predict_on_batch", x[:8]),
}
results = {}
for entry, run in ENTRIES.items():
    before = [w.copy() for w in model.get_weights()]
    calls.clear()
    printed, refused = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(printed):
            run()
    except RuntimeError as err:
        refused = str(err)
    changed = any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    results[entry] = {"refused": refused, "plan": printed.getvalue(), "weights_changed": changed,
                      "model_called": bool(calls)}
print(json.dumps(results))
