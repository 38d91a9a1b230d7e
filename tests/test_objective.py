"""The Objective's trackers against NumPy: exact weighted means over several updates."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tiny import tiny_data, tiny_model
from trainer.objective import Objective


def _cross_entropy(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    return np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(y)), y]


def _objective_and_batches(sizes=(7, 5)):
    x, y, w = tiny_data(sum(sizes))
    model = tiny_model()
    objective = Objective(model, y[:2], model(x[:2]))
    bounds = np.cumsum((0,) + sizes)
    batches = [(x[a:b], y[a:b], w[a:b]) for a, b in zip(bounds, bounds[1:])]
    return model, objective, batches


def _update_all(objective, model, batches, regularizations):
    """Updates `objective` with each batch; returns NumPy's sum(w*loss), sum(w) and correct predictions."""
    objective.reset()
    weighted_sum = weight_sum = correct = 0.0
    for (x, y, w), reg in zip(batches, regularizations):
        y_pred = model(x)
        losses, per_output = objective.per_example_losses(y, y_pred)
        objective.update(y, y_pred, tf.constant(w), losses, per_output, None if reg is None else tf.constant(reg))
        logits = keras.ops.convert_to_numpy(y_pred)
        weighted_sum += float(np.sum(_cross_entropy(logits, y) * w))
        weight_sum += float(np.sum(w))
        correct += int(np.sum(logits.argmax(axis=1) == y))
    return weighted_sum, weight_sum, correct


def test_loss_is_the_weighted_mean_plus_the_per_example_regularization():
    model, objective, batches = _objective_and_batches()
    regularizations = [0.25, 0.75]  # e.g. two replicas' steps, or a step before and after an update
    weighted_sum, weight_sum, _ = _update_all(objective, model, batches, regularizations)
    sizes = [len(b[0]) for b in batches]
    expected = weighted_sum / weight_sum + np.dot(regularizations, sizes) / sum(sizes)
    assert objective.results()["loss"] == pytest.approx(expected, rel=1e-5)


def test_without_regularization_its_tracker_is_left_alone():
    model, objective, batches = _objective_and_batches()
    weighted_sum, weight_sum, _ = _update_all(objective, model, batches, [None, None])
    assert float(objective.regularization_tracker.count) == 0.0
    assert objective.results()["loss"] == pytest.approx(weighted_sum / weight_sum, rel=1e-5)


def test_metrics_see_every_update_and_reset_clears_them():
    model, objective, batches = _objective_and_batches()
    _, _, correct = _update_all(objective, model, batches, [None, None])
    assert objective.results()["accuracy"] == pytest.approx(correct / sum(len(b[1]) for b in batches), rel=1e-6)
    objective.reset()
    assert objective.results() == {name: 0.0 for name in objective.results()}


def test_an_output_without_a_loss_gets_no_loss_tracker_and_shifts_none():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, {"a": keras.layers.Dense(2, name="a")(inputs),
                                 "b": keras.layers.Dense(1, name="b")(inputs)})
    model.compile(optimizer="sgd", loss={"a": None, "b": "mse"})
    x = np.random.default_rng(0).normal(size=(6, 3)).astype("float32")
    y = {"a": np.zeros((6, 2), "float32"), "b": np.ones((6, 1), "float32")}
    objective = Objective(model, y, model(x))
    objective.reset()
    y_pred = model(x)
    losses, per_output = objective.per_example_losses(y, y_pred)
    objective.update(y, y_pred, tf.ones([6]), losses, per_output, None)
    mse = float(np.mean((keras.ops.convert_to_numpy(y_pred["b"]) - 1.0) ** 2))
    results = objective.results()
    assert "a_loss" not in results
    assert results["b_loss"] == pytest.approx(mse, rel=1e-5)
    assert results["loss"] == pytest.approx(mse, rel=1e-5)


@pytest.mark.parametrize("loss_weights", [None, [0.5, 2.0], {"a": 0.5, "b": 2.0}])
def test_loss_weights_apply_per_output_as_compiled(loss_weights):
    inputs = keras.Input((3,))
    model = keras.Model(inputs, {"a": keras.layers.Dense(2, name="a")(inputs),
                                 "b": keras.layers.Dense(1, name="b")(inputs)})
    model.compile(optimizer="sgd", loss={"a": "mse", "b": "mse"}, loss_weights=loss_weights)
    x = np.random.default_rng(0).normal(size=(6, 3)).astype("float32")
    y = {"a": np.zeros((6, 2), "float32"), "b": np.ones((6, 1), "float32")}
    objective = Objective(model, y, model(x))
    y_pred = {k: keras.ops.convert_to_numpy(v) for k, v in model(x).items()}
    losses, _ = objective.per_example_losses(y, y_pred)
    wa, wb = (1.0, 1.0) if loss_weights is None else (0.5, 2.0)
    expected = wa * np.mean(y_pred["a"] ** 2, axis=1) + wb * np.mean((y_pred["b"] - 1.0) ** 2, axis=1)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(losses), expected, rtol=1e-5)
