"""A model's own train_step and test_step: handed the data as model.fit hands it, logged under the keys
they return (one device and 2 replicas in-process; the parity table runs the keras.io shapes on 1-3)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored
from trainer import Trainer

X = np.random.default_rng(0).normal(size=(24, 3)).astype("float32")


class Recorder(keras.Model):
    """Records the structure each of its steps is handed (at trace time) and trains on `x` found in it."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.tracker = keras.metrics.Mean(name="total")
        self.seen = {}

    @property
    def metrics(self):
        return [self.tracker]

    def call(self, data):
        while isinstance(data, (tuple, list)):
            data = data[0]
        return self.dense(data["a"] if isinstance(data, dict) else data)

    def _x(self, data, step):
        self.seen[step] = tf.nest.map_structure(lambda _: "tensor", data)
        return data

    def train_step(self, data):
        x = self._x(data, "train")
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self(x) - 1.0))
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}

    def test_step(self, data):
        x = self._x(data, "test")
        self.tracker.update_state(keras.ops.mean(keras.ops.square(self(x) - 1.0)))
        return {"loss": self.tracker.result()}

    def predict_step(self, data):
        return self(self._x(data, "predict"))


def _model():
    keras.utils.set_random_seed(1)
    model = Recorder()
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    return model


FORMS = {
    "array": lambda: X,
    "dict": lambda: {"a": X},
    "one_tuple": lambda: (X,),
    "dataset_bare": lambda: tf.data.Dataset.from_tensor_slices(X).batch(8),
    "dataset_tuple": lambda: tf.data.Dataset.from_tensor_slices((X,)).batch(8),
}


@pytest.mark.parametrize("form", list(FORMS))
def test_the_models_own_steps_get_the_data_as_model_fit_hands_it(form):
    # Keras hands a step x itself for `fit(x)` on an array or a dict (the keras.io VAE uses `data` as
    # its images), a tuple x wrapped once more, and a dataset's elements as they are.
    keras_model, trainer_model = _model(), _model()
    keras_history = keras_model.fit(FORMS[form](), batch_size=8, epochs=2, shuffle=False, verbose=0)
    keras_model.evaluate(FORMS[form](), batch_size=8, verbose=0)
    trainer = Trainer(strategy="default", verbose=0)
    history = trainer.fit(trainer_model, FORMS[form](), batch_size=8, epochs=2, shuffle=False)
    trainer.evaluate(trainer_model, FORMS[form](), batch_size=8)
    assert trainer_model.seen == keras_model.seen
    assert history.history.keys() == keras_history.history.keys() == {"loss"}
    np.testing.assert_allclose(history.history["loss"], keras_history.history["loss"], rtol=1e-5)
    if not form.startswith("dataset"):  # a dataset's predict elements: see below
        keras_model.predict(FORMS[form](), batch_size=8, verbose=0)
        trainer.predict(trainer_model, FORMS[form](), batch_size=8)
        assert trainer_model.seen["predict"] == keras_model.seen["predict"]


class Renamed(keras.Model):
    """keras.io's VAE logging: a tracker returned under another key, and a second tracker not returned."""

    def __init__(self, returned_value=None):
        super().__init__()
        self.dense = keras.layers.Dense(1)
        self.total = keras.metrics.Mean(name="total_loss")
        self.unlogged = keras.metrics.Mean(name="unlogged")
        self.returned_value = returned_value

    @property
    def metrics(self):
        return [self.total, self.unlogged]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self.dense(data) - 1.0))
        self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_weights), self.trainable_weights))
        self.total.update_state(loss)
        self.unlogged.update_state(2.0 * loss)
        logs = {"loss": self.total.result()}
        if self.returned_value == "raw":
            logs["raw"] = loss  # no metric made it: not exact across replicas
        if self.returned_value == "derived":
            logs["twice"] = 2.0 * self.total.result()
        return logs


def _renamed(returned_value=None):
    keras.utils.set_random_seed(2)
    model = Renamed(returned_value)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    return model


@pytest.mark.parametrize("strategy", ["default", "mirrored2"])
def test_history_has_the_keys_the_step_returns_read_across_replicas(strategy):
    reference = _renamed().fit(X, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    trainer = Trainer(strategy=mirrored(2) if strategy == "mirrored2" else strategy, verbose=0)
    history = trainer.fit(_renamed(), X, batch_size=8, epochs=2, shuffle=False).history
    assert history.keys() == reference.keys() == {"loss"}
    np.testing.assert_allclose(history["loss"], reference["loss"], rtol=1e-5)


@pytest.mark.parametrize("returned_value,strategy", [("raw", "default"), ("raw", "mirrored2"),
                                                     ("derived", "default")])
def test_a_returned_value_that_no_metric_made_is_logged_as_model_fit_logs_it(returned_value, strategy):
    """model.fit logs the last step's value. On several replicas each replica's value is weighed by its share
    of the batch: exact for a mean over the batch (the loss); a value the step derives from a metric's
    result reads that replica's part of the metric, so "derived" is compared on one device only."""
    reference = _renamed(returned_value).fit(X, batch_size=8, epochs=2, shuffle=False, verbose=0).history
    trainer = Trainer(strategy=mirrored(2) if strategy == "mirrored2" else strategy, verbose=0)
    history = trainer.fit(_renamed(returned_value), X, batch_size=8, epochs=2, shuffle=False).history
    assert history.keys() == reference.keys() and len(reference) == 2
    for key, values in reference.items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("replicas", [1, 2])
def test_kerass_distiller_trains_on_its_own_compute_loss_as_model_fit(replicas):
    """keras.distillation.Distiller compiles its base with loss=None and computes its loss itself: a method of
    Keras's own, not of its base model, which the trainer's step calls as Keras's would."""
    if not hasattr(keras, "distillation"):
        pytest.skip("this Keras has no keras.distillation")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(50, 6)).astype("float32"), (rng.normal(size=50) > 0).astype("int64")

    def distiller():
        keras.utils.set_random_seed(0)
        teacher = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
        student = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
        built = keras.distillation.Distiller(teacher=teacher, student=student,
                                             distillation_losses=keras.distillation.LogitsDistillation(temperature=2.0))
        built.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return built

    reference, model = distiller(), distiller()
    expected = reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    trainer = Trainer(strategy=mirrored(replicas), lr_scaling=None, verbose=0)
    history = trainer.fit(model, x, y, batch_size=16, epochs=2, shuffle=False)
    assert sorted(history.history) == sorted(expected.history)  # loss, total, student, distillation, accuracy
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.evaluate(model, x, y, batch_size=16),
                               reference.evaluate(x, y, batch_size=16, verbose=0), rtol=1e-5)
