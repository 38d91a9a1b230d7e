"""The engine under other strategies and settings gives the default strategy's numbers."""

import os
import platform
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored, run_python, tiny_data, tiny_model
from trainer import Trainer
from trainer.engine import engine


def _fit(strategy, regularized=True, optimizer_options=None, **kwargs):
    x, y, w = tiny_data(203)
    trainer = Trainer(strategy=strategy, batch_size=32, lr_scaling=None, verbose=0, **kwargs)
    history = trainer.fit(tiny_model(regularized=regularized, **(optimizer_options or {})), (x, y, w), epochs=2)
    return history.history, np.concatenate([v.ravel() for v in history.model.get_weights()])


@pytest.fixture(scope="module")
def reference():
    return _fit("default")


def _assert_same(result, reference):
    history, weights = result
    for key, values in reference[0].items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(weights, reference[1], rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_xla_matches_no_xla(reference):
    _assert_same(_fit("default", jit_compile=True), reference)


@pytest.mark.slow
@pytest.mark.parametrize("steps_per_execution", [1, 5])
def test_steps_per_execution_does_not_change_results(reference, steps_per_execution):
    _assert_same(_fit("default", steps_per_execution=steps_per_execution), reference)


def test_one_device_matches_default(reference):
    _assert_same(_fit(tf.distribute.OneDeviceStrategy("/cpu:0")), reference)


def test_central_storage_matches_default(reference):
    strategy = tf.distribute.experimental.CentralStorageStrategy(compute_devices=["/cpu:0", "/cpu:1", "/cpu:2"])
    _assert_same(_fit(strategy), reference)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["central_storage", "one_device"])
def test_optimizer_options_match_default(strategy):
    # Global clipping, accumulation and EMA (Keras applies the last two inside a `cond`, and its
    # EMA update fails on CentralStorage's aggregated variables): applied once, across replicas.
    options = dict(global_clipnorm=0.5, gradient_accumulation_steps=3, use_ema=True, ema_overwrite_frequency=4)
    if strategy == "central_storage":
        strategy = tf.distribute.experimental.CentralStorageStrategy(compute_devices=["/cpu:0", "/cpu:1", "/cpu:2"])
    _assert_same(_fit(strategy, optimizer_options=options), _fit("default", optimizer_options=options))


@pytest.mark.slow
def test_a_model_without_regularization_matches_default_under_xla_and_central_storage():
    # Its replicas track no regularization; under CentralStorageStrategy they return their values instead.
    plain = _fit("default", regularized=False)
    _assert_same(_fit("default", regularized=False, jit_compile=True), plain)
    strategy = tf.distribute.experimental.CentralStorageStrategy(compute_devices=["/cpu:0", "/cpu:1", "/cpu:2"])
    _assert_same(_fit(strategy, regularized=False), plain)


@pytest.mark.slow
@pytest.mark.parametrize("replicas, examples", [(2, 203), (3, 203), (3, 193)],
                         ids=["2replicas", "3replicas", "last-batch-of-1"])
def test_a_dataset_on_cpu_replicas_gives_the_default_strategys_numbers(replicas, examples):
    """The steps split each global batch among the replicas (the last one unevenly, or leaving some
    replicas nothing); fit, evaluate and predict match one device."""
    x, y, w = tiny_data(examples)
    data = tf.data.Dataset.from_tensor_slices((x, y, w))

    def run(strategy):
        trainer = Trainer(strategy=strategy, batch_size=32, lr_scaling=None, verbose=0)
        history = trainer.fit(tiny_model(), data, epochs=2, validation_data=data)
        weights = np.concatenate([v.ravel() for v in history.model.get_weights()])
        predictions = trainer.predict(history.model, tf.data.Dataset.from_tensor_slices(x))
        return history.history, weights, trainer.evaluate(history.model, data, return_dict=True), predictions

    reference, result = run("default"), run(mirrored(replicas))
    _assert_same(result[:2], reference[:2])
    for key, value in reference[2].items():
        np.testing.assert_allclose(result[2][key], value, rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(result[3], reference[3], rtol=1e-5, atol=1e-6)
    assert result[3].shape == (examples, 3)


def _run_everything(data, inputs):
    trainer = Trainer(strategy=mirrored(2), batch_size=32, lr_scaling="linear", warmup_steps=5, seed=0, verbose=0)
    history = trainer.fit(tiny_model(), data, epochs=2, validation_data=data)
    evaluation = trainer.evaluate(history.model, data, return_dict=True)
    return history.history, evaluation, trainer.predict(history.model, inputs)


@pytest.mark.slow
@pytest.mark.parametrize("as_dataset", [False, True], ids=["arrays", "dataset"])
def test_fit_evaluate_predict_need_no_autograph(as_dataset, monkeypatch):
    """The traced loops are explicit graph code: they trace and give the same numbers, where AutoGraph converts nothing.

    A CI run once met an unconverted step loop, whose Python `for` over a
    tensor then failed (see trainer/engine/tracing.py). Here every conversion fails,
    and AutoGraph falls back to running code as written.
    """
    from tensorflow.python.autograph.impl import api

    x, y, w = tiny_data(203)
    data, inputs = (x, y, w), x
    if as_dataset:
        data, inputs = (tf.data.Dataset.from_tensor_slices(d) for d in (data, inputs))
    reference = _run_everything(data, inputs)

    def no_conversion(entity, program_ctx):
        raise RuntimeError("AutoGraph converts nothing in this test")

    monkeypatch.setattr(api, "_convert_actual", no_conversion)
    history, evaluation, predictions = _run_everything(data, inputs)
    for key, values in reference[0].items():
        np.testing.assert_allclose(history[key], values, rtol=1e-6, err_msg=key)
    for key, value in reference[1].items():
        np.testing.assert_allclose(evaluation[key], value, rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(predictions, reference[2], rtol=1e-6)
    assert predictions.shape == (203, 3)


_ONEDNN_PROBE = """
import json
import tensorflow as tf
from trainer.engine import engine
print(json.dumps([engine._compat.onednn_enabled(), engine.cpu_onednn(tf.distribute.get_strategy())]))
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                    reason="TensorFlow's oneDNN default is for x86-64 Linux builds")
def test_onednn_state_follows_the_variable_and_tensorflows_cpu_rule(tmp_path):
    script = tmp_path / "onednn_probe.py"
    script.write_text(_ONEDNN_PROBE)
    # A variable the user set is theirs: the plan then suggests nothing.
    assert run_python(script, env={"TF_ENABLE_ONEDNN_OPTS": "1"}, timeout=120) == [True, None]
    assert run_python(script, env={"TF_ENABLE_ONEDNN_OPTS": "0"}, timeout=120) == [False, None]
    if "TF_ENABLE_ONEDNN_OPTS" in os.environ:
        return
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split())
    default_on = bool(flags & {"avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"})
    assert run_python(script, timeout=120) == [default_on, default_on]


def test_cpu_onednn_has_nothing_to_suggest_off_x86_or_when_the_user_chose(monkeypatch):
    strategy = tf.distribute.get_strategy()
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert engine.cpu_onednn(strategy) is None
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    assert engine.cpu_onednn(strategy) is None


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                    reason="reads the 'flags' line of x86-64 Linux's /proc/cpuinfo")
def test_cpu_flags_are_the_first_processors_flags():
    with open("/proc/cpuinfo") as f:
        line = next(line for line in f if line.startswith("flags"))
    assert engine.cpu_flags() == frozenset(line.partition(":")[2].split())
    assert "fpu" in engine.cpu_flags()


def test_cpu_native_bf16_names_amx_or_avx512_bf16_under_onednn_on_x86_linux(monkeypatch):
    strategy = tf.distribute.get_strategy()
    monkeypatch.setattr(engine.strategy_lib, "runs_on_accelerators", lambda s: False)  # also where a GPU is seen
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(engine._compat, "onednn_enabled", lambda: True)
    monkeypatch.setattr(engine, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}))
    assert engine.cpu_native_bf16(strategy) == "AMX"
    monkeypatch.setattr(engine, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))  # no AMX
    assert engine.cpu_native_bf16(strategy) == "AVX512_BF16"
    monkeypatch.setattr(engine, "cpu_flags", lambda: frozenset({"avx512f", "avx512_vnni", "avx2"}))  # emulated
    assert engine.cpu_native_bf16(strategy) is None
    monkeypatch.setattr(engine, "cpu_flags", lambda: frozenset({"avx512_bf16", "amx_tile", "amx_bf16"}))
    monkeypatch.setattr(engine._compat, "onednn_enabled", lambda: False)  # TF_ENABLE_ONEDNN_OPTS=0: Eigen's kernels
    assert engine.cpu_native_bf16(strategy) is None
    monkeypatch.setattr(engine._compat, "onednn_enabled", lambda: True)
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert engine.cpu_native_bf16(strategy) is None
