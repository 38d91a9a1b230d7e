"""Fits a two-Dense model as a user would, on a platform the trainer was not tested on; prints what happened.

Usage: python platform_run.py newer|moved [REPLICAS]

newer: Keras reports version 3.16.0 (as after `pip install -U keras`). moved: the module of Keras's TF optimizer
can no longer be imported by name (as if Keras had moved it), while Keras itself keeps the class it loaded. With
TRAINER_UNTESTED_VERSIONS=1 in the environment the fit should train; without it, it should be refused. Prints one
JSON line: {"refused": message or None, "plan": the plan's text, "weights_changed": bool}.
"""

import contextlib
import io
import json
import sys

from start import arguments, start

args = arguments(__doc__, options=(("mode", {"choices": ["newer", "moved"]}),
                                   ("replicas", {"type": int, "nargs": "?", "default": 1})))
mode, replicas = args.mode, args.replicas
start(cpus=replicas if replicas > 1 else 0)

import keras  # noqa: E402
import numpy as np  # noqa: E402

if mode == "newer":
    keras.version = lambda: "3.16.0"
else:  # Keras holds TFOptimizer already; a later import of the module by name fails
    import keras.src.backend.tensorflow.optimizer  # noqa: F401

    sys.modules["keras.src.backend.tensorflow.optimizer"] = None

from trainer import Trainer  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(21, 3)).astype("float32")
y = x @ np.array([[1.0], [-2.0], [0.5]], "float32")
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
model.compile(keras.optimizers.SGD(0.1), "mse")
before = [w.copy() for w in model.get_weights()]
printed, refused = io.StringIO(), None
try:
    with contextlib.redirect_stdout(printed):
        Trainer(strategy="mirrored" if replicas > 1 else "default", batch_size=8, verbose=1).fit(model, x, y, epochs=1)
except RuntimeError as err:
    refused = str(err)
changed = any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
print(json.dumps({"refused": refused, "plan": printed.getvalue(), "weights_changed": changed}))
