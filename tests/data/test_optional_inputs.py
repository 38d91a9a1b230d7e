"""Inputs given as None, as model.fit takes them: an optional input's absence (`keras.Input(optional=True)`),
and lists of inputs, through both readers and on two workers, against model.fit, evaluate and predict on one
device. Run as a script (`python test_optional_inputs.py OUT`), this file is a worker of the two-worker test."""

import re
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored, run_script, TESTS
from trainer import Trainer
from trainer.data import readers

RNG = np.random.default_rng(0)
X, Y = RNG.normal(size=(10, 2)).astype("float32"), RNG.normal(size=(10, 1)).astype("float32")


class AddIfGiven(keras.layers.Layer):
    def call(self, a, b=None):
        return a if b is None else a + b


def _model(optional=True):
    keras.utils.set_random_seed(0)
    a, b = keras.Input((2,), name="a"), keras.Input((2,), name="b", optional=optional)
    model = keras.Model([a, b], keras.layers.Dense(1)(AddIfGiven()(a, b)))
    model.compile("sgd", "mse")
    return model


def _keras_fit(model, *args, **kwargs):
    """model.fit, or a skip where this Keras's own fit does not take None for an input (3.8's adapters)."""
    try:
        return model.fit(*args, **kwargs)
    except AttributeError as err:
        pytest.skip(f"this Keras's model.fit does not take None for an input ({err})")


def _batches():
    for begin in range(0, 10, 4):
        yield (X[begin:begin + 4], None), Y[begin:begin + 4]


FORMS = {  # (fit's data, its batch_size, predict's x)
    "arrays": (lambda: ([X, None], Y), 4, lambda: [X, None]),
    "dataset": (lambda: (tf.data.Dataset.from_tensor_slices(((X, None), Y)).batch(4),), None,
                lambda: tf.data.Dataset.from_tensor_slices(((X, None),)).batch(4)),
    "generator": (lambda: (_batches(),), None, None),
}


@pytest.fixture(params=["in step", "accelerator"])
def reader(request, monkeypatch):
    if request.param == "accelerator":
        monkeypatch.setenv(readers.ACCELERATOR_READER, "1")
    return request.param


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("replicas", [1, 2])
def test_an_optional_input_given_none_trains_as_under_model_fit(form, replicas, reader):
    data, batch_size, predict_x = FORMS[form]
    sized = {} if batch_size is None else {"batch_size": batch_size}
    reference, model = _model(), _model()
    expected = _keras_fit(reference, *data(), epochs=2, shuffle=False, verbose=0, **sized)
    trainer = Trainer(strategy=mirrored(replicas), lr_scaling=None, verbose=0)
    history = trainer.fit(model, *data(), epochs=2, shuffle=False, **sized)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    if form != "generator":  # a generator is spent
        np.testing.assert_allclose(trainer.evaluate(model, *data(), **sized),
                                   reference.evaluate(*data(), verbose=0, **sized), rtol=1e-5)
        np.testing.assert_allclose(trainer.predict(model, predict_x(), **sized),
                                   reference.predict(predict_x(), verbose=0, **sized), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["arrays", "dataset"])
def test_a_required_input_given_none_gets_kerass_own_error(form):
    data, batch_size, _ = FORMS[form]
    sized = {} if batch_size is None else {"batch_size": batch_size}
    with pytest.raises(ValueError) as keras_error:
        _keras_fit(_model(optional=False), *data(), epochs=1, verbose=0, **sized)
    with pytest.raises((ValueError, RuntimeError)) as ours:  # Keras 3.8's build wraps it in a RuntimeError
        Trainer(strategy="default", verbose=0).fit(_model(optional=False), *data(), epochs=1, **sized)

    def unnamed(text):  # the models' names aside ('functional', 'functional_3')
        return re.sub(r"functional(_\d+)?", "functional", text)

    assert unnamed(str(keras_error.value).splitlines()[0]) in unnamed(str(ours.value))


def test_a_list_of_inputs_trains_through_the_accelerator_reader(monkeypatch):
    """tf.data stacked a list of arrays into one tensor (and failed on shapes that differ): a tuple, as Keras's
    own arrays are given to the model on TensorFlow."""
    monkeypatch.setenv(readers.ACCELERATOR_READER, "1")
    xb = RNG.normal(size=(10, 3)).astype("float32")

    def model():
        keras.utils.set_random_seed(0)
        a, b = keras.Input((2,), name="a"), keras.Input((3,), name="b")
        built = keras.Model([a, b], keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
        built.compile("sgd", "mse")
        return built

    reference, trained = model(), model()
    expected = reference.fit([X, xb], Y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    history = Trainer(strategy=mirrored(2), lr_scaling=None, verbose=0).fit(trained, [X, xb], Y, batch_size=4,
                                                                            epochs=2, shuffle=False)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"], rtol=1e-5)


TWO_WORKER_FORMS = ["arrays", "dataset"]  # a generator is read whole by each worker, which no test here asks


@pytest.mark.slow  # processes of their own
def test_an_optional_input_given_none_trains_as_under_model_fit_on_two_workers(tmp_path):
    """Two workers under trainer-launch, each of the 4 logical CPUs conftest gives a process that imports it:
    8 replicas in sync, each worker fed its rows of every global batch of 4 (the last batch of 2, fewer rows
    than replicas, computed whole by each and counted once)."""
    references = {}
    for form in TWO_WORKER_FORMS:  # first: a Keras whose fit takes no None skips before any worker starts
        data, batch_size, _ = FORMS[form]
        model = _model()
        history = _keras_fit(model, *data(), epochs=2, shuffle=False, verbose=0,
                             **({} if batch_size is None else {"batch_size": batch_size}))
        references[form] = history.history["loss"], model.get_weights()
    run_script(__file__, tmp_path, launch=("--workers", "2"), env={"PYTHONPATH": str(TESTS)})  # conftest for each
    for form, (loss, weights) in references.items():
        for task in (0, 1):
            with np.load(tmp_path / f"{form}-{task}.npz") as got:
                np.testing.assert_allclose(got["loss"], loss, rtol=1e-5)
                for i, want in enumerate(weights):
                    np.testing.assert_allclose(got[f"weight_{i}"], want, rtol=1e-5, atol=1e-6)


def _worker(out: Path) -> None:
    """A worker of the two-worker test: fits each form and saves its loss history and weights."""
    from trainer import cluster_info

    trainer = Trainer(lr_scaling=None, verbose=0)  # first: the multi-worker strategy starts before anything runs
    task = cluster_info().task_id
    for form in TWO_WORKER_FORMS:
        data, batch_size, _ = FORMS[form]
        model = _model()
        history = trainer.fit(model, *data(), epochs=2, shuffle=False,
                              **({} if batch_size is None else {"batch_size": batch_size}))
        np.savez(out / f"{form}-{task}.npz", loss=history.history["loss"],
                 **{f"weight_{i}": w for i, w in enumerate(model.get_weights())})


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
