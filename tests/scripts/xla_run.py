"""Trains with the XLA that jit_compile="auto" chooses for GPUs, on CPU replicas that read and decide as GPUs do;
then Keras's own fit on one device with compile(jit_compile=True), the reference (under XLA a Dropout draws
other numbers than without it, on one device as on several).

Usage: python xla_run.py REPLICAS
The caller sets TRAINER_ACCELERATOR_READER=1, so that the replicas read through TensorFlow's distributed
iterator, as on GPUs. The strategy is then taken for one on GPUs (`runs_on_accelerators`), so that the
Trainer's "auto" and the builder's compile(jit_compile="auto") decide as they do there. The model has Dropout
and a metric; 45 examples in global batches of 10 leave a last batch of 5 (3 + 2 on two replicas).
Prints JSON: the plan's execution row, and for each run its history, evaluate, weights and predictions.
"""

import json

from start import arguments, start

args = arguments(__doc__, ("replicas", int))
start(cpus=args.replicas)

import contextlib  # noqa: E402
import io  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.distribute import strategy as strategy_lib  # noqa: E402


def build(jit_compile="auto"):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="gelu"),
                              keras.layers.Dropout(0.3, seed=5), keras.layers.Dense(3)])
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=jit_compile)
    return model


def flat(model):
    return np.concatenate([w.ravel() for w in model.get_weights()]).tolist()


rng = np.random.RandomState(0)
x, y = rng.rand(45, 6).astype("float32"), rng.randint(0, 3, 45)
results = {}

strategy_lib.runs_on_accelerators = lambda strategy: True  # the replicas are taken for GPUs
trainer = Trainer(strategy=tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)]),
                  batch_size=10, lr_scaling=None, seed=0, verbose=2)
shown = io.StringIO()
with contextlib.redirect_stdout(shown):
    history = trainer.fit(build, x, y, epochs=3, shuffle=False)
model = history.model
execution = next(line for line in shown.getvalue().splitlines() if line.strip().startswith("execution"))
results["trainer"] = {"history": history.history, "evaluate": trainer.evaluate(model, x, y, return_dict=True),
                      "weights": flat(model), "predict": trainer.predict(model, x).tolist(),
                      "xla": bool(trainer._runs.engines[0].steps.xla)}

reference = build(jit_compile=True)  # Keras's own XLA: a draw under XLA is not the one without it
keras_history = reference.fit(x, y, batch_size=10, epochs=3, shuffle=False, verbose=0)
results["keras"] = {"history": keras_history.history,
                    "evaluate": reference.evaluate(x, y, batch_size=10, return_dict=True, verbose=0),
                    "weights": flat(reference), "predict": reference.predict(x, batch_size=10, verbose=0).tolist()}
print(json.dumps({"execution": execution.strip(), **results}))
