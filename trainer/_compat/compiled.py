"""Metric variables across replicas, and Keras's compiled losses and metrics.
"""

from __future__ import annotations

import contextlib
from typing import Any

import keras
import tensorflow as tf

from .patches import Patches

# Read, not called through a hook: listed so that `_compat.platform` checks that they are there before a call.
_TARGETS = Patches("the compiled loss and its build, as Model.fit runs them", [
    (name, keras.Model, name, None, f"Trainer.{name} (keras/src/trainers/trainer.py)")
    for name in ("_compute_loss", "_symbolic_build")], {})

# Metric variables across replicas -----------------------------------------------
#
# Keras 3.10+ creates every metric variable with synchronization="on_read"
# (keras/src/metrics/metric.py, checked on 3.10 and 3.15): under MirroredStrategy
# each replica accumulates into a copy of its own and a read sums (or averages)
# the copies. Keras 3.8 and 3.9 pass only the aggregation, so the variable is an
# on-write MirroredVariable, and Keras's `assign_add` (`assign(self + value)`)
# in R replicas leaves R * old + the sum of the updates: every metric and loss
# tracker after the first step of an epoch is wrong (keras-team/keras#21054,
# fixed by #21072; Keras's own fit and evaluate are wrong there too).
# `metric_variables_on_read` gives such variables what Keras 3.10 would have
# created (checked on 3.8 and 3.15); on a Keras that does so itself it changes nothing.


def _on_write_mirrored(value) -> bool:
    return (type(value).__name__ == "MirroredVariable"
            and getattr(value, "aggregation", tf.VariableAggregation.NONE) != tf.VariableAggregation.NONE)


def metric_variables_on_read(model: keras.Model, strategy: tf.distribute.Strategy) -> bool:
    """Re-creates the metric variables of `model` that are on-write mirrored as on-read ones (Keras 3.8 and
    3.9; a no-op on 3.10+, which creates them so). Returns whether any was replaced."""
    metrics = list(model.metrics)
    metrics += [m for m in (loss_tracker(model), compile_metrics(model)) if m is not None]
    compiled = compile_loss(model)
    metrics += list(getattr(compiled, "metrics", None) or [])
    replaced, seen = False, set()
    for metric in metrics:
        for variable in getattr(metric, "variables", []):
            value = getattr(variable, "_value", None)
            if id(variable) in seen or value is None or not _on_write_mirrored(value):
                continue
            seen.add(id(variable))
            with strategy.scope(), tf.init_scope():
                variable._value = tf.Variable(
                    value.read_value(), dtype=value.dtype, trainable=False, name=variable.name,
                    aggregation=value.aggregation, synchronization=tf.VariableSynchronization.ON_READ)
            replaced = True
    if replaced:  # functions Keras traced before captured the variables replaced
        for name in ("train_function", "test_function"):
            if getattr(model, name, None) is not None:
                setattr(model, name, None)
    return replaced


# Compiled losses and metrics ---------------------------------------------------


def compile_loss(model: keras.Model) -> Any:
    """The `CompileLoss` that `compile(loss=...)` made, or None."""
    return getattr(model, "_compile_loss", None)


def compile_metrics(model: keras.Model) -> Any:
    """The `CompileMetrics` that `compile(metrics=..., weighted_metrics=...)` made, or None."""
    return getattr(model, "_compile_metrics", None)


def loss_tracker(model: keras.Model) -> keras.metrics.Mean | None:
    """The `Mean` named "loss" that `compile` made and `Model.train_step` updates."""
    return getattr(model, "_loss_tracker", None)


def compiled_specs(model: keras.Model) -> dict[str, Any]:
    """What the user passed to `compile` for loss, loss weights and metrics: the objects themselves
    (its compile *config* would need every custom loss and metric registered with Keras)."""
    loss, metrics = compile_loss(model), compile_metrics(model)
    return {
        "loss": getattr(loss, "_user_loss", model.loss),
        "loss_weights": getattr(loss, "_user_loss_weights", None),
        "metrics": getattr(metrics, "_user_metrics", None),
        "weighted_metrics": getattr(metrics, "_user_weighted_metrics", None),
    }


def compiled_metric_list(metric: Any) -> list | None:
    """The metrics inside Keras's `CompileMetrics` container (whose `result()` is a dict), else None."""
    if type(metric).__name__ == "CompileMetrics":
        return list(getattr(metric, "metrics", []) or [])
    return None


@contextlib.contextmanager
def results_recorded(model: keras.Model, made_by: dict[int, tuple[Any, str]]):
    """While a step traces: which of `model.metrics` made each value its `result()` returned.

    Fills `made_by` with id(value) -> (value, the metric's key in
    `model.get_metrics_result()`). Each metric's `result` is shadowed on the
    instance for the duration (Keras 3.0-3.16 metrics are plain objects),
    from the tracing thread, so that every replica thread sees it.
    """
    metrics = []
    for metric in model.metrics:
        metrics += compiled_metric_list(metric) or [metric]
    shadowed = []
    for metric in metrics:
        if "result" in vars(metric):
            continue  # the instance's own `result`, or shadowed already by an enclosing trace
        def result(*args, _original=metric.result, _name=metric.name, **kwargs):
            value = _original(*args, **kwargs)
            made_by[id(value)] = (value, _name)
            return value

        vars(metric)["result"] = result
        shadowed.append(metric)
    try:
        yield
    finally:
        for metric in shadowed:
            vars(metric).pop("result", None)


def compute_loss(model: keras.Model, x, y, y_pred, sample_weight, training: bool):
    """`model.compute_loss` through Keras's wrapper, which passes `training` only to overrides that take it."""
    return model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)


def symbolic_build(model: keras.Model, data_batch: Any) -> None:
    """Builds the compiled losses' and metrics' state as `Model.fit` does, without running the model."""
    model._symbolic_build(data_batch=data_batch)


def requested_initial_epoch(model: keras.Model) -> int | None:
    """The epoch a callback asked fit to start from in `on_train_begin`, by setting `model._initial_epoch`:
    Keras's BackupAndRestore does, and `Model.fit` starts from it when set (keras/src/backend/tensorflow/
    trainer.py `fit`: `self._initial_epoch or initial_epoch`; 3.8-3.16)."""
    return getattr(model, "_initial_epoch", None)


def resolved_loss(identifier: Any, y_true: Any, y_pred: Any) -> Any:
    """A compiled loss as Keras resolves it for one output: a name through `keras.losses.get`, except
    "crossentropy" and "ce", which Keras picks from the targets' and the output's shapes (binary, sparse
    categorical or categorical; `compile_utils.get_loss`, keras/src/trainers/compile_utils.py, 3.8-3.16)."""
    if not isinstance(identifier, str):
        return identifier
    from keras.src.trainers.compile_utils import get_loss

    return get_loss(identifier, y_true, y_pred)
