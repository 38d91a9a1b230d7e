"""Bad input fails fast, with the argument, the value and the fix, before any state changes."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored, tiny_data, tiny_model
from trainer import Trainer


@pytest.fixture
def model():
    return tiny_model()


def _snapshot(model):
    return [w.copy() for w in model.get_weights()], model.optimizer


def _assert_untouched(model, snapshot):
    weights, optimizer = snapshot
    assert model.optimizer is optimizer
    assert int(optimizer.iterations) == 0
    for before, after in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(before, after)


@pytest.mark.parametrize("make_data, error, pattern", [
    (lambda x, y, w: (x, y[:-1]), ValueError, r"same number of examples.*\[203, 202\]"),
    (lambda x, y, w: (x, y, w[:10]), ValueError, r"same number of examples.*\[203, 203, 10\]"),
    (lambda x, y, w: (x[:0], y[:0]), ValueError, r"`data` is empty"),
    (lambda x, y, w: tf.data.Dataset.from_tensor_slices((x, y)).take(0), ValueError, r"empty tf.data.Dataset"),
    (lambda x, y, w: tf.data.Dataset.from_tensor_slices((x, y)).batch(8), ValueError, r"looks batched.*unbatch"),
    (lambda x, y, w: x, TypeError, r"`data` must be \(x, y\)"),
])
def test_bad_data_is_rejected_before_training(model, data, make_data, error, pattern):
    snapshot = _snapshot(model)
    with pytest.raises(error, match=pattern):
        Trainer(strategy="default", verbose=0).fit(model, make_data(*data))
    _assert_untouched(model, snapshot)


def test_validation_structure_must_match_training(model, data):
    x, y, w = data
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match=r"`validation_data` must have the same structure"):
        Trainer(strategy="default", verbose=0).fit(model, (x, y), validation_data=(x[:, :4], y))
    with pytest.raises(ValueError, match=r"`validation_data` must have the same structure"):
        Trainer(strategy="default", verbose=0).fit(model, (x, y), validation_data=({"a": x}, y))
    _assert_untouched(model, snapshot)


def test_batch_size_below_replica_count(model, data):
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match=r"`batch_size` must be at least the number of replicas \(4\).*batch_size=3"):
        Trainer(strategy=mirrored(4), batch_size=3, verbose=0).fit(model, data[:2])
    _assert_untouched(model, snapshot)


def test_both_batch_arguments():
    with pytest.raises(ValueError, match=r"not both.*per_replica_batch_size=8, batch_size=64"):
        Trainer(per_replica_batch_size=8, batch_size=64)


def test_unknown_strategy_name():
    with pytest.raises(ValueError, match=r"Unknown `strategy` name.*'mirorred'.*mirrored"):
        Trainer(strategy="mirorred")
    with pytest.raises(ValueError, match=r"Unknown `strategy` name"):
        Trainer(strategy="default").fit(tiny_model(), tiny_data()[:2], strategy="gpu")


def test_uncompiled_model(data):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=r"must be compiled.*model.compile"):
        Trainer(strategy="default", verbose=0).fit(model, data[:2])
    with pytest.raises(ValueError, match=r"`model\(\)` must be compiled"):
        Trainer(strategy="default", verbose=0).fit(lambda: keras.Sequential([keras.layers.Dense(3)]), data[:2])


@pytest.mark.parametrize("kwargs, pattern", [
    ({"lr_scaling": "cubic"}, r"`lr_scaling` must be one of"),
    ({"per_replica_batch_size": 0}, r"`per_replica_batch_size` must be a positive integer"),
    ({"steps_per_execution": 0}, r"`steps_per_execution` must be a positive integer"),
    ({"warmup_epochs": 1, "warmup_steps": 5}, r"not both"),
    ({"jit_compile": "yes"}, r"`jit_compile` must be"),
    ({"strategy": 3}, r"`strategy` must be a tf.distribute.Strategy or a name"),
])
def test_bad_constructor_arguments(kwargs, pattern):
    with pytest.raises((ValueError, TypeError), match=pattern):
        Trainer(**kwargs)


@pytest.mark.parametrize("kwargs, pattern", [
    ({"epochs": -1}, r"`epochs` must be a non-negative integer"),
    ({"epochs": 2, "initial_epoch": 3}, r"`initial_epoch` must be an integer in \[0, epochs\]"),
    ({"steps_per_epoch": 0}, r"`steps_per_epoch` must be a positive integer"),
])
def test_bad_fit_arguments(model, data, kwargs, pattern):
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match=pattern):
        Trainer(strategy="default", verbose=0).fit(model, data[:2], **kwargs)
    _assert_untouched(model, snapshot)


def test_tpu_fails_fast_without_a_tpu():
    with pytest.raises(ValueError, match=r"found no reachable TPU"):
        Trainer(strategy="tpu", verbose=0).fit(tiny_model(), tiny_data()[:2])
