"""TensorFlow's guide pattern: a model built and compiled in the user's `with strategy.scope():`, trained.

Usage: scope_run.py REPLICAS RUNNER WHERE. RUNNER is keras (model.fit, the
reference), own (a Trainer with its own "mirrored" or "auto" strategy), user
(a Trainer given the user's strategy object) or shared (one Trainer made at the
top, given each strategy as `trainer.fit(model, ..., strategy=strategy)`); WHERE is inside (the call in
the scope) or after (after the `with` block). As keras.io's guide does, a
first model trains and evaluates, then `run_training` twice makes a new
MirroredStrategy, restores the last checkpoint with `keras.models.load_model` in
its scope (a new model the first time) and trains again. Prints one JSON line:
each run's history and evaluate, and the final weights' sum of squares.
"""

import contextlib
import json
import os
import tempfile

from start import arguments, start

args = arguments(__doc__, ("replicas", int), options=(("runner", {"choices": ["keras", "own", "user", "shared"]}),
                                                      ("where", {"choices": ["inside", "after"]})))
REPLICAS, RUNNER, WHERE = args.replicas, args.runner, args.where
start(cpus=REPLICAS)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer import Trainer  # noqa: E402

trainer = (Trainer(strategy="mirrored" if REPLICAS > 1 else "auto", verbose=0) if RUNNER == "own"
           else Trainer(verbose=0) if RUNNER == "shared" else None)
rng = np.random.default_rng(0)
x, y = rng.random((203, 16)).astype("float32"), rng.integers(0, 10, 203)
train = tf.data.Dataset.from_tensor_slices((x[:150], y[:150])).batch(16)
val = tf.data.Dataset.from_tensor_slices((x[150:], y[150:])).batch(16)


def get_compiled_model():
    inputs = keras.Input(shape=(16,))
    hidden = keras.layers.Dense(32, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(10)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=[keras.metrics.SparseCategoricalAccuracy()])
    return model


def call(method, model, strategy, *args, **kwargs):
    if RUNNER == "keras":
        return getattr(model, method)(*args, **kwargs, verbose=0)
    if RUNNER == "shared":
        return getattr(trainer, method)(model, *args, strategy=strategy, **kwargs)
    runner = trainer or Trainer(strategy=strategy, verbose=0)
    return getattr(runner, method)(model, *args, **kwargs)


def scoped(strategy, build):
    """Builds in the strategy's scope; returns (model, the scope to call in: the same, or none after it)."""
    with strategy.scope():
        model = build()
    return model, strategy.scope() if WHERE == "inside" else contextlib.nullcontext()


runs = []
strategy = tf.distribute.MirroredStrategy()
keras.utils.set_random_seed(0)
model, where = scoped(strategy, get_compiled_model)
with where:
    history = call("fit", model, strategy, train, epochs=2, validation_data=val)
    runs.append({"history": history.history, "evaluate": call("evaluate", model, strategy, val)})

checkpoints = tempfile.mkdtemp()


def make_or_restore_model():
    saved = [os.path.join(checkpoints, name) for name in os.listdir(checkpoints)]
    if saved:
        return keras.models.load_model(max(saved, key=os.path.getctime))
    keras.utils.set_random_seed(1)
    return get_compiled_model()


def run_training(epochs=1):
    strategy = tf.distribute.MirroredStrategy()
    model, where = scoped(strategy, make_or_restore_model)
    callbacks = [keras.callbacks.ModelCheckpoint(filepath=os.path.join(checkpoints, "ckpt-{epoch}.keras"))]
    with where:
        history = call("fit", model, strategy, train, epochs=epochs, callbacks=callbacks, validation_data=val)
    runs.append({"history": history.history, "weights": float(sum(np.sum(w ** 2) for w in model.get_weights()))})


run_training()
run_training()
print(json.dumps(runs))
