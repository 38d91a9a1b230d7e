"""The private Keras attributes the trainer reads, in one place.

Each was checked on Keras 3.15.1 (TensorFlow backend); each has a fallback or
fails with a message that names it, so a Keras release that moves one breaks
here, not somewhere in a step function.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable

import keras
import tensorflow as tf

try:  # keras/src/losses/loss.py (3.0-3.15): the 1/replicas scaling of reduced losses
    from keras.src.losses import loss as _loss_module
except ImportError:  # pragma: no cover - a Keras without it has no hook to take
    _loss_module = None

try:  # keras/src/backend/tensorflow/optimizer.py (3.0-3.15): sums the replicas' gradients in a replica
    from keras.src.backend.tensorflow.optimizer import TFOptimizer as _TFOptimizer
except ImportError:  # pragma: no cover
    _TFOptimizer = None

try:  # keras/src/backend/common/masking.py (3.5+); older Keras sets `_keras_mask` itself
    from keras.src.backend import get_keras_mask, set_keras_mask
except ImportError:  # pragma: no cover
    def get_keras_mask(x: Any) -> Any:
        return getattr(x, "_keras_mask", None)

    def set_keras_mask(x: Any, mask: Any) -> None:
        try:
            x._keras_mask = mask
        except AttributeError:
            pass


# Replica shares -------------------------------------------------------------
#
# Keras scales every reduced loss inside a replica by 1/replicas
# (`scale_loss_for_distribution`), its loss trackers undo it
# (`unscale_loss_for_distribution`), and its optimizer sums the replicas'
# gradients (`TFOptimizer._all_reduce_sum_gradients`). 1/replicas is each
# replica's share of the global batch only when every replica holds as many
# examples. While the trainer traces a step, the three read the factors that
# the trainer set for the replica thread that traces (`replica_share`); code
# outside `replica_share`, or traced outside `replica_loss_scaling`, sees Keras's own.

_share = threading.local()  # .factors: {"scale", "unscale", "gradients"} for this replica thread, or unset
_installed = [0]  # nesting depth of `replica_loss_scaling`
_originals: dict[str, Callable] = {}


def _factor(name: str):
    factors = getattr(_share, "factors", None)
    return None if factors is None else factors[name]


def _times(value, factor):
    if isinstance(factor, float) and factor == 1.0:
        return value
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(value.values * tf.cast(factor, value.values.dtype), value.indices, value.dense_shape)
    return value * tf.cast(factor, value.dtype)


def _scale(value):
    factor = _factor("scale")
    return _originals["scale"](value) if factor is None else _times(value, factor)


def _unscale(value):
    factor = _factor("unscale")
    return _originals["unscale"](value) if factor is None else _times(value, factor)


def _all_reduce_sum_gradients(self, grads_and_vars):
    factor = _factor("gradients")
    if factor is not None:
        grads_and_vars = [(None if g is None else _times(g, factor), v) for g, v in grads_and_vars]
    return _originals["gradients"](self, grads_and_vars)


_HOOKS = (  # (key, owner, attribute, replacement)
    ("scale", _loss_module, "scale_loss_for_distribution", _scale),
    ("unscale", _loss_module, "unscale_loss_for_distribution", _unscale),
    ("gradients", _TFOptimizer, "_all_reduce_sum_gradients", _all_reduce_sum_gradients),
)


def loss_scaling_supported() -> bool:
    return all(owner is not None and hasattr(owner, attribute) for _, owner, attribute, _ in _HOOKS)


@contextlib.contextmanager
def replica_loss_scaling():
    """While tracing step functions: Keras's replica scaling reads `replica_share`'s factors.

    Installed only for the duration (Keras's functions are put back after), and
    only the threads inside `replica_share` see other factors than Keras's.
    """
    if not loss_scaling_supported():  # pragma: no cover - checked on Keras 3.8 and 3.15
        yield
        return
    if _installed[0] == 0:
        for key, owner, attribute, replacement in _HOOKS:
            _originals[key] = getattr(owner, attribute)
            setattr(owner, attribute, replacement)
    _installed[0] += 1
    try:
        yield
    finally:
        _installed[0] -= 1
        if _installed[0] == 0:
            for key, owner, attribute, _ in _HOOKS:
                setattr(owner, attribute, _originals.pop(key))


@contextlib.contextmanager
def replica_share(*, scale=1.0, unscale=1.0, gradients=None):
    """Inside a replica's trace: the factors Keras's replica scaling uses (see above).

    Keras's own are scale=1/replicas, unscale=replicas and gradients=None
    (summed as they are). 1.0 leaves a value as it is.
    """
    previous = getattr(_share, "factors", None)
    _share.factors = {"scale": scale, "unscale": unscale, "gradients": gradients}
    try:
        yield
    finally:
        _share.factors = previous


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
    """What the user passed to `compile` for loss, loss weights and metrics: the objects themselves.

    Re-creating a model from its compile *config* needs every custom loss and
    metric registered with Keras; the objects need nothing.
    """
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


def compute_loss(model: keras.Model, x, y, y_pred, sample_weight, training: bool):
    """`model.compute_loss`, also for overrides written before Keras 3.3 added `training`."""
    wrapper = getattr(model, "_compute_loss", None)
    if wrapper is not None:
        return wrapper(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
    return model.compute_loss(x, y, y_pred, sample_weight)  # pragma: no cover


def symbolic_build(model: keras.Model, data_batch: Any) -> None:
    """Builds the compiled losses' and metrics' state as `Model.fit` does, without running the model."""
    build = getattr(model, "_symbolic_build", None)
    if build is None:  # pragma: no cover
        raise RuntimeError("This Keras has no Model._symbolic_build (checked on 3.15); the trainer needs one.")
    build(data_batch=data_batch)
