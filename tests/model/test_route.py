"""The trainer beneath model.fit (trainer/model/route.py): a model's own fit, evaluate and predict run, and Keras's
backend methods beneath them run the trainer's engine.

Each model here overrides a method the way users and libraries do (preparing
the data in a tf.data map, changing an argument, looping over train_on_batch);
each is held against model.fit on one device with the same data, seed and
global batch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored, tiny_data, tiny_model
from trainer import Trainer, _compat


class Scaled(keras.Sequential):
    """Takes raw features at 10x their scale: its own fit, evaluate and predict divide them by 10 in a tf.data map,
    as a KerasHub task preprocesses, and its fit trains with class weights unless told otherwise."""

    def _prepared(self, x, y=None, batch_size=None):
        data = (x,) if y is None else (x, y)
        dataset = tf.data.Dataset.from_tensor_slices(data).batch(batch_size or 32)
        return dataset.map(lambda x, *rest: (x / 10.0, *rest))

    def fit(self, x=None, y=None, batch_size=None, class_weight=None, **kwargs):
        return super().fit(self._prepared(x, y, batch_size), class_weight=class_weight or {0: 1.0, 1: 2.0, 2: 0.5},
                           **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        return super().evaluate(self._prepared(x, y, batch_size), **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        return super().predict(self._prepared(x, batch_size=batch_size), **kwargs)


def _scaled_model():
    keras.utils.set_random_seed(0)
    model = Scaled([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def _runs(run, x, y):
    model = _scaled_model()
    history = run("fit", model, x, y, batch_size=16, epochs=2, validation_data=(x[:50], y[:50]))
    return (history.history, run("evaluate", model, x, y, batch_size=16),
            run("predict", model, x[:40], batch_size=16), model.get_weights())


def _assert_same(got, want, tolerance=1e-5):
    (history, evaluation, predictions, weights), (ref_history, ref_evaluation, ref_predictions, ref_weights) = got, want
    assert list(history) == list(ref_history)
    for key in ref_history:
        np.testing.assert_allclose(history[key], ref_history[key], rtol=tolerance, err_msg=key)
    np.testing.assert_allclose(evaluation, ref_evaluation, rtol=tolerance)
    np.testing.assert_allclose(predictions, ref_predictions, rtol=tolerance, atol=1e-6)
    for a, b in zip(weights, ref_weights):
        np.testing.assert_allclose(a, b, rtol=tolerance, atol=1e-6)


def _keras(method, model, *args, **kwargs):
    return getattr(model, method)(*args, **kwargs, verbose=0)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_models_own_fit_prepares_the_data_the_trainer_trains_on(replicas):
    x, y, _ = tiny_data()
    x = x * 10.0
    trainer = Trainer(strategy=mirrored(replicas) if replicas > 1 else "default", verbose=0, lr_scaling=None)

    def through(method, model, *args, **kwargs):
        return getattr(trainer, method)(model, *args, **kwargs)

    _assert_same(_runs(through, x, y), _runs(_keras, x, y))


def test_the_trainers_batch_is_handed_to_the_models_own_fit():
    x, y, _ = tiny_data()
    seen = []

    class Recording(Scaled):
        def fit(self, x=None, y=None, batch_size=None, **kwargs):
            seen.append(batch_size)
            return super().fit(x, y, batch_size=batch_size, **kwargs)

    keras.utils.set_random_seed(0)
    model = Recording([keras.Input((8,)), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0, lr_scaling=None)
    trainer.fit(model, x, y)
    trainer.fit(model, x, y, batch_size=10)
    assert seen == [32, 10]  # the Trainer's global batch (16 per replica x 2), else fit's own


def test_a_fit_that_takes_no_batch_size_gets_none():
    x, y, _ = tiny_data()

    class Narrow(keras.Sequential):
        def fit(self, x, y, epochs=1):  # as model.fit would be called on it: no batch_size
            return super().fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0)

    _assert_trains_as_model_fit(Narrow, x, y, epochs=2)


def test_a_fit_that_trains_batch_by_batch_runs_each_batch_on_the_strategy():
    x, y, _ = tiny_data()

    class OwnLoop(keras.Sequential):
        def fit(self, x=None, y=None, batch_size=32, epochs=1, **kwargs):
            for start in range(0, len(x), batch_size):
                self.train_on_batch(x[start:start + batch_size], y[start:start + batch_size])

    _assert_trains_as_model_fit(OwnLoop, x, y, batch_size=48)


def _assert_trains_as_model_fit(model_class, x, y, **kwargs):
    """A `model_class` Sequential's own fit, called by Trainer.fit on 2 replicas, ends at model.fit's weights."""
    def make():
        keras.utils.set_random_seed(0)
        model = model_class([keras.Input((8,)), keras.layers.Dense(3)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    reference, model = make(), make()
    reference.fit(x, y, **kwargs)
    Trainer(strategy=mirrored(2), lr_scaling=None, verbose=0).fit(model, x, y, **kwargs)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_fit_that_never_reaches_keras_is_named():
    class Elsewhere(keras.Sequential):
        def fit(self, *args, **kwargs):
            return None

    model = Elsewhere([keras.Input((8,)), keras.layers.Dense(3)])
    model.compile("sgd", "mse")
    with pytest.raises(RuntimeError, match=r"Elsewhere\.fit returned without calling Keras's own fit"):
        Trainer(verbose=0).fit(model, *tiny_data()[:2])


def test_distribute_runs_every_model_fit_inside_the_block_on_the_trainer():
    x, y, _ = tiny_data()
    contexts = []

    class Seen(keras.callbacks.Callback):
        def set_trainer_context(self, context):  # only the trainer hands this over
            contexts.append(context.plan.num_replicas)

    trainer = Trainer(strategy=mirrored(2), batch_size=16, verbose=0, lr_scaling=None)
    reference = _scaled_model()
    reference.fit(x * 10, y, batch_size=16, epochs=2, verbose=0)
    model = _scaled_model()
    with trainer.distribute():
        model.fit(x * 10, y, batch_size=16, epochs=2, verbose=0, callbacks=[Seen()])
        evaluation = model.evaluate(x * 10, y, batch_size=16, verbose=0)
    assert contexts == [2]
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(evaluation, reference.evaluate(x * 10, y, batch_size=16, verbose=0), rtol=1e-5)
    model.fit(x * 10, y, batch_size=16, verbose=0, callbacks=[Seen()])  # after the block: Keras's own
    assert contexts == [2]
    reference.fit(x * 10, y, batch_size=16, verbose=0)  # as the model was, after the block
    with trainer.distribute():  # Keras's per-batch methods too: one global batch over the 2 replicas
        logs = model.train_on_batch(x[:9] * 10, y[:9], return_dict=True)
    want = reference.train_on_batch(x[:9] * 10, y[:9], return_dict=True)  # floats, or 0-d arrays on Keras 3.8
    assert sorted(logs) == sorted(want)
    for key in want:
        np.testing.assert_allclose(logs[key], want[key], rtol=1e-5, err_msg=key)
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_keras_methods_are_put_back_after_each_call():
    from keras_names import backend_trainer

    def inner(name):
        cells = backend_trainer().__dict__[name].__closure__ or ()
        return [cell.cell_contents for cell in cells] + [backend_trainer().__dict__[name]]

    before = {name: inner(name) for name in _compat.KERAS_METHODS}
    model = tiny_model()
    trainer = Trainer(verbose=0)
    trainer.fit(model, *tiny_data()[:2])
    with pytest.raises(TypeError):
        trainer.fit(model, "not data")
    assert {name: inner(name) for name in _compat.KERAS_METHODS} == before
