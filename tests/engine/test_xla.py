"""XLA under jit_compile="auto": the decision for every way a model can be compiled, on CPUs, GPUs and TPUs
(faked), and the numbers of XLA on 2 replicas reading as GPUs do."""

import os
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import SCRIPTS, mirrored, run_python
from trainer import Trainer
from trainer.data import readers
from trainer.engine import engine
from trainer.model import models


class _GPUs:
    """What the XLA decision reads of a MirroredStrategy over two GPUs."""

    num_replicas_in_sync = 2

    class extended:
        worker_devices = ("/job:localhost/replica:0/task:0/device:GPU:0",
                          "/job:localhost/replica:0/task:0/device:GPU:1")


class _TPUs(tf.distribute.TPUStrategy):
    """A TPUStrategy as far as the XLA decision looks: its type, and eight replicas."""

    num_replicas_in_sync = 8

    def __init__(self):  # no TPU to connect to
        pass


CPUS = tf.distribute.get_strategy()
GPUS, TPUS = _GPUs(), _TPUs()


def _layers(noise=False):
    extra = [keras.layers.GaussianNoise(0.1)] if noise else []
    return [keras.Input((4,)), keras.layers.Dense(3), *extra, keras.layers.Dense(1)]


def _compiled(jit_compile="auto", in_scope_of=None, **compile_kwargs):
    def build():
        model = keras.Sequential(_layers(**compile_kwargs))
        model.compile("sgd", "mse", jit_compile=jit_compile)
        return model
    if in_scope_of is None:
        return build(), None
    notes = models.InScope()
    model = models.from_builder(build, in_scope_of, seed=0, in_scope=notes)
    return model, notes.jit_asked.get(model)


def _built_in_scope(layers):
    """A builder's model of `layers`, compiled with compile's defaults, and what its compile was given."""
    def build():
        model = keras.Sequential(layers)
        model.compile("sgd", "mse")
        return model
    notes = models.InScope()
    model = models.from_builder(build, mirrored(1), seed=0, in_scope=notes)
    return model, notes.jit_asked[model]


def _decide(strategy, setting, built):
    model, compiled_with = built
    return engine.jit_for(strategy, setting, model, None, compiled_with)


@pytest.mark.parametrize("setting", [True, False])
def test_the_trainers_own_setting_holds_everywhere(setting):
    for strategy in (CPUS, GPUS, TPUS):
        for built in (_compiled(), _compiled(jit_compile=not setting), _compiled(in_scope_of=mirrored(1))):
            assert _decide(strategy, setting, built) == (setting, "")


def test_a_builders_auto_is_on_for_gpus_and_tpus_though_keras_turns_it_off_in_the_scope():
    built = _compiled(in_scope_of=mirrored(1))
    assert built[1] == "auto" and built[0].jit_compile is False  # what Keras made of "auto" in the scope
    assert _decide(GPUS, "auto", built) == (True, "auto: on for GPUs and TPUs")
    assert _decide(TPUS, "auto", built) == (True, "auto: on for GPUs and TPUs")
    assert _decide(CPUS, "auto", built) == (False, "")


def test_a_builders_explicit_setting_is_kept():
    off = _compiled(jit_compile=False, in_scope_of=mirrored(1))
    on = _compiled(jit_compile=True, in_scope_of=mirrored(1))
    assert off[1] is False and on[1] is True
    for strategy in (CPUS, GPUS, TPUS):
        assert _decide(strategy, "auto", off) == (False, "off as the model's compile(jit_compile=False) left it")
        assert _decide(strategy, "auto", on) == (True, "XLA from the model's compile(jit_compile=...)")


def test_a_model_compiled_out_of_sight_keeps_what_keras_made_of_its_compile():
    # Made outside any scope, Keras's "auto" is on wherever a GPU is, so a False there was the user's.
    assert _decide(GPUS, "auto", _compiled(jit_compile=False)) == (
        False, "off as the model's compile(jit_compile=False) asked")
    assert _decide(CPUS, "auto", _compiled(jit_compile=True)) == (True, "XLA from the model's compile(jit_compile=...)")
    # Made in a strategy's scope, Keras's "auto" and an explicit False look alike: off, and the plan says why.
    with mirrored(1).scope():
        model = keras.Sequential(_layers())
    model.compile("sgd", "mse")
    jit, why = _decide(GPUS, "auto", (model, None))
    assert not jit and "made in a strategy's scope" in why and "Trainer(jit_compile=True)" in why
    assert _decide(CPUS, "auto", (model, None)) == (False, "")


def test_auto_leaves_xla_off_where_keras_gives_the_model_none():
    class NoXLA(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.supports_jit = False

        def call(self, x):
            return x

    built = _built_in_scope([keras.Input((4,)), NoXLA(), keras.layers.Dense(1)])
    jit, why = _decide(GPUS, "auto", built)
    assert not jit and "supports_jit=False" in why
    assert _decide(GPUS, True, built) == (True, "")  # the Trainer's True is the user's


def test_the_forward_pass_all_reduce_keeps_xla_off_on_several_replicas():
    # synchronized, as the trainer makes every BatchNormalization for a fit on several replicas
    built = _built_in_scope([keras.Input((4,)), keras.layers.BatchNormalization(synchronized=True),
                             keras.layers.Dense(1)])
    jit, why = _decide(GPUS, "auto", built)
    assert not jit and "all-reduces across the replicas" in why


def test_compiles_are_noted_in_a_distribute_block_and_nowhere_else():
    trainer = Trainer(verbose=0)
    outside = keras.Sequential(_layers())
    outside.compile("sgd", "mse", jit_compile=False)
    with trainer.distribute():
        inside = keras.Sequential(_layers())
        inside.compile("sgd", "mse")
    asked = trainer._runs.in_scope.jit_asked
    assert isinstance(asked, weakref.WeakKeyDictionary)
    assert asked.get(inside) == "auto" and outside not in asked
    # and Keras's compile is Keras's own again
    from trainer._compat import compile_requests
    assert keras.Model.compile is compile_requests._KerasTrainer.compile
    assert compile_requests._KerasTrainer.compile is not compile_requests._compile


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_xla_on_replicas_reading_as_gpus_gives_one_devices_xla_numbers(replicas):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", readers.ACCELERATOR_READER: "1"}
    out = run_python(SCRIPTS / "xla_run.py", str(replicas), env=env, timeout=600)
    assert out["execution"].endswith("XLA on (auto: on for GPUs and TPUs)"), out["execution"]
    ours, keras_ = out["trainer"], out["keras"]
    assert ours["xla"]
    assert list(ours["history"]) == list(keras_["history"]) == ["accuracy", "loss"]
    for key, values in keras_["history"].items():
        np.testing.assert_allclose(ours["history"][key], values, rtol=1e-5, err_msg=key)
    for key, value in keras_["evaluate"].items():
        np.testing.assert_allclose(ours["evaluate"][key], value, rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(ours["weights"], keras_["weights"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours["predict"], keras_["predict"], rtol=1e-5, atol=1e-6)
