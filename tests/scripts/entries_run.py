"""Trains one problem through both of the trainer's doors and saves what each gave: `trainer.fit(model, ...)`
and `with trainer.distribute(): model.fit(...)`, each with evaluate and predict.

Usage: python entries_run.py OUT_DIR [--replicas N] [--reference]

--reference: Keras's own `model.fit`, `evaluate` and `predict` on one device, without the trainer. Otherwise a
MirroredStrategy over N CPU replicas of one process, or (N 1, "auto") one worker under `trainer-launch`.
95 examples at a global batch of 30 (a last batch of 5), Adam, BatchNormalization. Each task writes
OUT_DIR/<door><task>.json (history, evaluate) and .npz (weights, predictions), <door> "fit" or "distribute".
"""

import json
import os

from start import REFERENCE, REPLICAS, arguments, start

args = arguments(__doc__, ("out", str), options=(REPLICAS, REFERENCE))
start(cpus=args.replicas if args.replicas > 1 else 0)

import numpy as np  # noqa: E402

from trainer import Trainer, cluster_info  # noqa: E402

trainer = None if args.reference else Trainer(strategy="mirrored" if args.replicas > 1 else "auto", batch_size=30,
                                              lr_scaling=None, seed=0, verbose=1)

import keras  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(95, 6)).astype("float32")
y = (x[:, :3].sum(axis=1) > 0).astype("int32") + (x[:, 3] > 1).astype("int32")


def model() -> keras.Model:
    keras.utils.set_random_seed(1)
    made = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    made.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                 metrics=["accuracy"])
    return made


def save(door: str, trained: keras.Model, history: dict, evaluate: list, predictions) -> None:
    info = cluster_info()
    name = f"{door}{info.task_type or 'single'}{info.task_id}"
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump({"history": history, "evaluate": dict(zip(("loss", "accuracy"), evaluate))}, f)
    weights = np.concatenate([w.ravel() for w in trained.get_weights()])
    np.savez(os.path.join(args.out, f"{name}.npz"), weights=weights, predictions=predictions)


fit = dict(epochs=3, shuffle=False, verbose=0)
if trainer is None:
    m = model()
    history = m.fit(x, y, batch_size=30, **fit).history
    save("keras", m, history, m.evaluate(x, y, batch_size=30, verbose=0), m.predict(x, batch_size=30, verbose=0))
else:
    m = model()
    history = trainer.fit(m, x, y, **{**fit, "verbose": 1}).history
    save("fit", m, history, trainer.evaluate(m, x, y, verbose=0), trainer.predict(m, x, verbose=0))
    m = model()
    with trainer.distribute():
        history = m.fit(x, y, batch_size=30, **{**fit, "verbose": 1}).history
        save("distribute", m, history, m.evaluate(x, y, batch_size=30, verbose=0),
             m.predict(x, batch_size=30, verbose=0))
