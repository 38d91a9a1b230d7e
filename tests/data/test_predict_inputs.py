"""predict reads the features of each element as Keras's predict does: x of x, (x,), (x, y) and (x, y, w), for
every structure of x (one tensor, a tuple of inputs, a dict of named inputs), through `Trainer.predict` and
`model.predict` inside `Trainer.distribute()`, on 1 and 2 replicas (and 2 through the reader GPUs use), against
`model.predict` on one device."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored
from trainer import Trainer
from trainer.data import readers

rng = np.random.default_rng(0)
XA, XB = rng.normal(size=(10, 3)).astype("float32"), rng.normal(size=(10, 2)).astype("float32")
Y, W = rng.normal(size=(10, 1)).astype("float32"), rng.uniform(size=10).astype("float32")


def _model(structure):
    keras.utils.set_random_seed(0)
    a = keras.Input((3,), name="a")
    if structure == "one":
        return keras.Model(a, keras.layers.Dense(2)(a))
    b = keras.Input((2,), name="b")
    return keras.Model([a, b], keras.layers.Dense(2)(keras.layers.Concatenate()([a, b])))


X = {"one": XA, "tuple": (XA, XB), "dict": {"a": XA, "b": XB}}
ELEMENTS = {"x": lambda x: x, "(x,)": lambda x: (x,), "(x, y)": lambda x: (x, Y), "(x, y, w)": lambda x: (x, Y, W)}


# A tuple of inputs alone reads as (x, y) in Keras too: its first input is x (the last test).
CASES = [(structure, element) for structure in X for element in ELEMENTS if (structure, element) != ("tuple", "x")]


@pytest.mark.parametrize("structure, element", CASES)
@pytest.mark.parametrize("replicas, reader", [(1, "in step"), (2, "in step"), (2, "accelerator")])
def test_predict_drops_targets_and_weights_as_keras_does(structure, element, replicas, reader, monkeypatch):
    if reader == "accelerator":  # replicas read as GPUs read: TensorFlow's distributed iterator
        monkeypatch.setenv(readers.ACCELERATOR_READER, "1")
    model = _model(structure)

    def data():
        return tf.data.Dataset.from_tensor_slices(ELEMENTS[element](X[structure])).batch(4)

    expected = model.predict(data(), verbose=0)
    trainer = Trainer(strategy=mirrored(replicas), verbose=0)
    np.testing.assert_allclose(trainer.predict(model, data()), expected, rtol=1e-6, atol=1e-7)
    with trainer.distribute():
        np.testing.assert_allclose(model.predict(data(), verbose=0), expected, rtol=1e-6, atol=1e-7)


def test_a_tuple_of_inputs_alone_is_refused_as_keras_refuses_it():
    """Keras reads (a, b) as (x, y): its model gets `a` alone and fails; the trainer refuses it first."""
    model = _model("tuple")
    data = tf.data.Dataset.from_tensor_slices((XA, XB)).batch(4)
    with pytest.raises(ValueError, match="expects 2"):
        model.predict(data, verbose=0)
    with pytest.raises(ValueError, match=r"`x` must hold one array per model input \(2: \['a', 'b'\]\)"):
        Trainer(strategy="default", verbose=0).predict(model, data)
