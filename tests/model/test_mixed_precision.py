"""Opt-in mixed precision: 16-bit layers, float32 variables and losses, loss scaling for float16."""

import keras
import numpy as np
import pytest

from conftest import mirrored, tiny_data, tiny_model
from trainer import Trainer
from trainer.model import models


def _fit(policy, strategy="default"):
    x, y, w = tiny_data()
    trainer = Trainer(strategy=strategy, per_replica_batch_size=32, lr_scaling=None, mixed_precision=policy,
                      verbose=0)
    history = trainer.fit(tiny_model, (x, y, w), epochs=3)  # a builder: called under the policy
    return history, trainer.evaluate(history.model, (x, y, w), return_dict=True)


@pytest.mark.slow
@pytest.mark.parametrize("policy, compute", [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")])
def test_layers_compute_in_16_bits_and_train_like_float32(policy, compute):
    reference, ref_eval = _fit(None)
    history, evaluation = _fit(policy)
    model = history.model
    dense = [layer for layer in model.layers if layer.weights]
    assert all(layer.compute_dtype == compute for layer in dense)
    assert all(v.dtype == "float32" for v in model.weights)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer) == (policy == "mixed_float16")
    # 16-bit arithmetic: close to the float32 run, not equal to it.
    np.testing.assert_allclose(history.history["loss"], reference.history["loss"], rtol=0.05)
    assert abs(evaluation["loss"] - ref_eval["loss"]) < 0.05 * ref_eval["loss"]
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_the_plan_names_the_policy(capsys):
    x, y, w = tiny_data()
    Trainer(strategy="default", mixed_precision="mixed_bfloat16", verbose=2).fit(tiny_model, (x, y, w))
    assert "precision      mixed_bfloat16: layers compute in bfloat16" in capsys.readouterr().out


@pytest.mark.slow
def test_mixed_precision_under_mirrored_strategy():
    history, evaluation = _fit("mixed_bfloat16", strategy=mirrored(2))
    assert np.isfinite(evaluation["loss"]) and history.history["loss"][-1] < history.history["loss"][0]


def test_unknown_policy_is_rejected():
    with pytest.raises(ValueError, match=r"`mixed_precision` must be one of.*mixed_precision='float16'"):
        Trainer(mixed_precision="float16")


@pytest.mark.slow
def test_a_reloaded_float16_model_keeps_loss_scaling_and_its_policy(tmp_path, capsys):
    # Keras reloads a Sequential with float32 as the container's own policy; its layers keep float16.
    x, y, w = tiny_data()
    trained = Trainer(strategy="default", mixed_precision="mixed_float16", verbose=0).fit(tiny_model, (x, y, w))
    trained.model.save(tmp_path / "f16.keras")
    reloaded = keras.models.load_model(tmp_path / "f16.keras")
    history = Trainer(strategy="default", verbose=2).fit(reloaded, (x, y, w))
    assert isinstance(history.model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert "precision      mixed_float16: layers compute in float16" in capsys.readouterr().out
    history = Trainer(strategy="default", mixed_precision="mixed_float16", verbose=0).fit(reloaded, (x, y, w))
    assert history.model is reloaded  # already in float16


def _mixed_model_with_float32_head(policy: str = "mixed_bfloat16") -> keras.Model:
    keras.utils.set_random_seed(0)
    keras.config.set_dtype_policy(policy)
    try:
        body = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu")])
    finally:
        keras.config.set_dtype_policy("float32")
    model = keras.Sequential([keras.Input((8,)), body, keras.layers.Dense(3, dtype="float32")])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_precision_is_read_from_the_weighted_layers_of_nested_models():
    from trainer.model.models import precision

    class Odd(keras.layers.Layer):  # a user layer whose `layers` is not a list of layers
        layers = 6

    assert precision(_mixed_model_with_float32_head()) == "float32+mixed_bfloat16"
    assert precision(keras.Sequential([keras.Input((8,)), Odd(), keras.layers.Dense(2)])) == "float32"
    assert precision(keras.Sequential([keras.Input((8,)), keras.layers.Flatten()])) == "float32"  # no weights


def test_a_float32_output_head_is_kept_under_a_mixed_policy():
    x, y, w = tiny_data()
    model = _mixed_model_with_float32_head()
    history = Trainer(strategy="default", mixed_precision="mixed_bfloat16", verbose=0).fit(model, (x, y, w))
    assert history.model is model
    assert model.layers[-1].dtype_policy.name == "float32"


def test_activity_and_weight_regularization_add_up_in_float32():
    # The activity regularizer's loss comes in the layers' bfloat16, the kernel regularizer's in float32.
    def build():
        model = keras.Sequential([
            keras.Input((8,)),
            keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3),
                               activity_regularizer=keras.regularizers.L2(1e-3)),
            keras.layers.Dense(3),
        ])
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    x, y, w = tiny_data()
    trainer = Trainer(strategy="default", per_replica_batch_size=32, mixed_precision="mixed_bfloat16", verbose=0)
    history = trainer.fit(build, (x, y, w), epochs=2)
    assert {keras.backend.standardize_dtype(loss.dtype) for loss in history.model.losses} == {"bfloat16", "float32"}
    assert np.all(np.isfinite(history.history["loss"]))
    assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_a_float32_output_head_is_kept_when_the_model_trains_in_a_strategys_scope(policy):
    x, y, w = tiny_data()
    model = _mixed_model_with_float32_head(policy)
    trainer = Trainer(strategy=mirrored(2), mixed_precision=policy, verbose=0)
    history = trainer.fit(model, (x, y, w))
    assert history.model is model  # built outside the scope: moved into it, in place
    assert models.precision(model) == f"float32+{policy}"
    assert model.layers[-1].dtype_policy.name == "float32"
    assert trainer.predict(model, x).dtype == np.float32


def test_a_model_instance_in_another_policy_is_refused_with_the_fix_before_anything_changes():
    x, y, w = tiny_data()
    model = tiny_model()
    with pytest.raises(ValueError, match=r"(?s)`mixed_precision='mixed_bfloat16'`.*computing in float32.*"
                                         r"Trainer.fit\(lambda: make_model\(\), ...\)"):
        Trainer(strategy="default", mixed_precision="mixed_bfloat16", verbose=0).fit(model, (x, y, w))
    assert not model.optimizer.built and int(model.optimizer.iterations.numpy()) == 0
