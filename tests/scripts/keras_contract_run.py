"""What Keras's own tests turned up, with ordinary models: run by model.fit on one device, or beneath the trainer.

Usage: keras_contract_run.py OUT REPLICAS RUNNER [CASE ...]. RUNNER is keras
(the reference: Keras's own methods, one device) or trainer (the same code
inside `with Trainer().distribute():`, on REPLICAS logical CPUs, or on the
workers of trainer-launch when TF_CONFIG is set). Writes OUT/task<id>.json:
for each case, what the code saw (histories, the values of every
train_on_batch, evaluate, predict, the final weights, what callbacks logged).

Cases:
  on_batch      a GAN written with train_on_batch, test_on_batch and predict_on_batch (keras.io's DCGAN
                loop before custom train steps), on a global batch of 13
  small_batch   fit, evaluate and predict with batch_size=1 and 2 on 7 examples, validation included
  no_trainable  a model with every layer frozen, and a subclassed model whose call only updates a
                non-trainable variable: loss and metrics still tracked
  vector_logs   F1Score (a value per class) and EarlyStopping: what callbacks receive, by type
  nan_logs      TerminateOnNaN with a CSVLogger, on a model whose loss overflows
  layer_trainer a layer that mixes in Keras's backend trainer, as Keras's tests train
"""

import contextlib
import csv
import json
import os
import tempfile
import warnings

from start import arguments, start

args = arguments(__doc__, ("out", str), ("replicas", int), ("runner", str), ("cases", str, "*"))
OUT, REPLICAS, RUNNER = args.out, args.replicas, args.runner
CASES = args.cases or ["on_batch", "small_batch", "no_trainable", "vector_logs", "nan_logs", "layer_trainer"]
start(cpus=0 if "TF_CONFIG" in os.environ else REPLICAS)

from trainer import Trainer, cluster_info  # noqa: E402

# Multi-worker strategies must exist before TensorFlow runs anything, so the Trainer comes first.
trainer = Trainer(strategy="mirrored" if REPLICAS > 1 else "auto", verbose=0) if RUNNER == "trainer" else None

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras_names import backend_trainer  # noqa: E402

TensorFlowTrainer = backend_trainer()  # Keras's backend trainer, under its 3.8-3.15 name


def _floats(value):
    """JSON-able: arrays as lists, NumPy scalars as floats (nan and inf as JSON's NaN and Infinity)."""
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_floats(v) for v in value]
    if isinstance(value, str):
        return value
    return np.asarray(value, dtype=np.float64).tolist()


def _dense_model(seed=0, units=3, optimizer=None):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(units)])
    model.compile(optimizer or keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def on_batch():
    keras.utils.set_random_seed(1)
    latent = 3
    generator = keras.Sequential([keras.Input((latent,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(4)], name="generator")
    discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                      keras.layers.Dense(1)], name="discriminator")
    discriminator.compile(keras.optimizers.Adam(0.01), keras.losses.BinaryCrossentropy(from_logits=True),
                          metrics=["accuracy"])
    discriminator.trainable = False
    noise_in = keras.Input((latent,))
    gan = keras.Model(noise_in, discriminator(generator(noise_in)))
    gan.compile(keras.optimizers.Adam(0.01), keras.losses.BinaryCrossentropy(from_logits=True))
    discriminator.trainable = True
    rng = np.random.default_rng(0)
    real = rng.normal(1.0, 0.5, size=(40, 4)).astype("float32")
    seen = []
    for step in range(3):
        noise = rng.normal(size=(13, latent)).astype("float32")
        fake = generator.predict_on_batch(noise)
        batch = np.concatenate([real[13 * step: 13 * step + 13], fake])
        labels = np.concatenate([np.ones((13, 1)), np.zeros((13, 1))]).astype("float32")
        seen.append(discriminator.train_on_batch(batch, labels, return_dict=True))
        seen.append(gan.train_on_batch(noise, np.ones((13, 1), "float32")))
    seen.append(discriminator.test_on_batch(real[:13], np.ones((13, 1), "float32")))
    seen.append(discriminator.train_on_batch(real[:1], np.ones((1, 1), "float32")))  # one row: replicas left empty
    return {"seen": seen, "generated": generator.predict_on_batch(rng.normal(size=(5, latent)).astype("float32")),
            "weights": generator.get_weights() + discriminator.get_weights()}


def small_batch():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 4)).astype("float32"), rng.integers(0, 3, 7)
    result = {}
    for batch_size in (1, 2):
        model = _dense_model(optimizer=keras.optimizers.SGD(0.05))
        history = model.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, validation_data=(x, y), verbose=0)
        result[str(batch_size)] = {"history": history.history, "keys": sorted(history.history),
                                   "evaluate": model.evaluate(x, y, batch_size=batch_size, verbose=0),
                                   "predict": model.predict(x, batch_size=batch_size, verbose=0),
                                   "weights": model.get_weights()}
    return result


class Counting(keras.Model):
    """A subclassed model with no trainable weight: its call marks that it trained, in a non-trainable variable."""

    def __init__(self):
        super().__init__()
        self.trained = self.add_weight(shape=(), initializer="zeros", trainable=False, name="trained")

    def call(self, x, training=False):
        if training:
            self.trained.assign(1.0)
        return x * 2.0


def no_trainable():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(40, 4)).astype("float32"), rng.integers(0, 3, 40)
    frozen = _dense_model()
    for layer in frozen.layers:
        layer.trainable = False
    frozen.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=["accuracy"])
    counting = Counting()
    counting.compile(keras.optimizers.SGD(), "mse", metrics=["mae"])
    result = {}
    for name, model, targets in (("frozen", frozen, y), ("counting", counting, x)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras's "does not have any trainable weights", once per trace
            history = model.fit(x, targets, batch_size=16, epochs=2, shuffle=False, verbose=0)
        result[name] = {"history": history.history, "keys": sorted(history.history),
                        "evaluate": model.evaluate(x, targets, batch_size=16, verbose=0),
                        "weights": model.get_weights()}
    return result


class Received(keras.callbacks.Callback):
    """What a callback gets at each epoch's end: the logs' keys, their values' types and the values."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({key: [type(value).__name__, value] for key, value in sorted(logs.items())})


def vector_logs():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 4)).astype("float32"), np.eye(3)[rng.integers(0, 3, 48)].astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile(keras.optimizers.Adam(0.05), "categorical_crossentropy", metrics=[keras.metrics.F1Score()])
    received = Received()
    stopping = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    history = model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0, callbacks=[received, stopping])
    return {"received": received.epochs, "history": history.history, "stopped_epoch": stopping.stopped_epoch,
            "evaluate": model.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)}


def nan_logs():
    rng = np.random.default_rng(0)
    x, y = rng.random((40, 4)).astype("float32"), rng.random((40, 2)).astype("float32")
    model = keras.Sequential([keras.Input((4,))] + [
        keras.layers.Dense(2, activation="relu", kernel_initializer=keras.initializers.Constant(1e5))
        for _ in range(5)] + [keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(), "mse")
    path = os.path.join(tempfile.mkdtemp(), "log.csv")
    history = model.fit(x, y, batch_size=8, epochs=5, shuffle=False, verbose=0, validation_data=(x, y),
                        callbacks=[keras.callbacks.TerminateOnNaN(), keras.callbacks.CSVLogger(path)])
    with open(path) as f:
        rows = list(csv.reader(f))
    return {"history": {k: [str(v) for v in values] for k, values in history.history.items()}, "csv": rows}


class LayerTrainer(TensorFlowTrainer, keras.layers.Dense):
    """Keras's backend trainer mixed into a layer, as Keras's own tests build their models."""

    def __init__(self, units):
        keras.layers.Dense.__init__(self, units=units, use_bias=False, kernel_initializer=keras.initializers.Ones())
        TensorFlowTrainer.__init__(self)


def layer_trainer():
    x, y = np.linspace(-1, 1, 40 * 4).reshape(40, 4).astype("float32"), np.zeros((40, 3), "float32")
    model = LayerTrainer(3)
    model.compile(keras.optimizers.SGD(0.1), "mse", metrics=[keras.metrics.MeanSquaredError()])
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return {"history": history.history, "keys": sorted(history.history),
            "evaluate": model.evaluate(x, y, batch_size=16, verbose=0),
            "predict": model.predict(x, batch_size=16, verbose=0), "weights": model.get_weights()}


results = {}
with trainer.distribute() if trainer is not None else contextlib.nullcontext():
    for case in CASES:
        results[case] = _floats(globals()[case]())
os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, f"task{cluster_info().task_id}.json"), "w") as f:
    json.dump(results, f)
