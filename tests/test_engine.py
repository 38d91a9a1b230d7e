"""The engine under other strategies and settings gives the default strategy's numbers."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import tiny_data, tiny_model
from trainer import Trainer


def _fit(strategy, **kwargs):
    x, y, w = tiny_data(203)
    trainer = Trainer(strategy=strategy, batch_size=32, lr_scaling=None, verbose=0, **kwargs)
    history = trainer.fit(tiny_model(), (x, y, w), epochs=2)
    return history.history, np.concatenate([v.ravel() for v in history.model.get_weights()])


@pytest.fixture(scope="module")
def reference():
    return _fit("default")


def _assert_same(result, reference):
    history, weights = result
    for key, values in reference[0].items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(weights, reference[1], rtol=1e-5, atol=1e-7)


def test_xla_matches_no_xla(reference):
    _assert_same(_fit("default", jit_compile=True), reference)


@pytest.mark.parametrize("steps_per_execution", [1, 5])
def test_steps_per_execution_does_not_change_results(reference, steps_per_execution):
    _assert_same(_fit("default", steps_per_execution=steps_per_execution), reference)


def test_one_device_matches_default(reference):
    _assert_same(_fit(tf.distribute.OneDeviceStrategy("/cpu:0")), reference)


def test_central_storage_matches_default(reference):
    strategy = tf.distribute.experimental.CentralStorageStrategy(compute_devices=["/cpu:0", "/cpu:1", "/cpu:2"])
    _assert_same(_fit(strategy), reference)
