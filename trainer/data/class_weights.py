"""`class_weight` as `model.fit` applies it: each example weighed by its target class (the argmax of a one-hot
row, else the rounded label), for arrays and datasets; refused, with the fix, where it cannot be."""

from __future__ import annotations

import numbers
import reprlib
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from trainer.data.array_input import ArrayInput


def refused(class_weight: Any, what: str, fix: str) -> None:
    """Refuses `class_weight` for `what`, a form whose batches the trainer does not see."""
    if class_weight is not None:
        raise ValueError(
            f"`class_weight` can't be applied to {what}, whose batches the trainer does not see until they run. "
            f"Received: class_weight={reprlib.repr(class_weight)}. Put {fix} instead."
        )


def check_class_weight(class_weight: Any) -> None:
    """A mapping {class index: weight}, as `model.fit` takes it."""
    if class_weight is None:
        return
    if not isinstance(class_weight, dict) or not all(
            isinstance(k, (numbers.Integral, np.integer)) and isinstance(v, (numbers.Real, np.number))
            for k, v in class_weight.items()):
        raise TypeError(
            f"`class_weight` must be a dict mapping class indices (int) to weights (float); up to Keras 3.15 "
            f"model.fit ignores keys of other types, so those weights would do nothing (3.16 refuses them). "
            f"Received: class_weight="
            f"{reprlib.repr(class_weight)} of type {type(class_weight).__name__}. Pass e.g. "
            "class_weight={0: 1.0, 1: 5.0}; classes left out weigh 1.0."
        )


def _class_indices(y: Any) -> Any:
    """Keras's reading of targets as classes: the argmax of one-hot rows, else the rounded label."""
    if len(y.shape) > 1 and y.shape[-1] != 1:
        return np.argmax(y, axis=-1) if isinstance(y, np.ndarray) else tf.argmax(y, axis=-1)
    if isinstance(y, np.ndarray):
        return np.round(y.reshape(len(y))).astype(np.int64)
    return tf.cast(tf.round(tf.reshape(y, [-1])), tf.int64)


def weighed(inp: ArrayInput, class_weight: dict, arg: str) -> ArrayInput:
    """Arrays with Keras's class weights as their sample weights."""
    if not isinstance(inp.arrays, tuple) or len(inp.arrays) < 2:
        no_targets(class_weight, arg)
    x, y, *weights = inp.arrays
    single_target(y, weights, class_weight)
    classes = _class_indices(y)
    weights = np.array([class_weight.get(int(c), 1.0) for c in range(int(classes.max()) + 1)], np.float32)
    return ArrayInput((x, y, weights[classes]), inp.num_examples)


def no_targets(class_weight: Any, arg: str) -> None:
    raise ValueError(
        f"`class_weight` weighs examples by their target class, and `{arg}` has features only (no y). Received: "
        f"class_weight={reprlib.repr(class_weight)}. Pass the targets (fit(model, x, y, class_weight=...)), or "
        "drop class_weight."
    )


def single_target(y: Any, weights: list, class_weight: Any) -> None:
    if weights:
        raise ValueError(
            "`class_weight` and `sample_weight` can't both be given (Keras refuses them together too). "
            f"Received: class_weight={reprlib.repr(class_weight)} and a sample_weight. Multiply the class "
            "weights into sample_weight yourself, and drop class_weight."
        )
    if isinstance(y, (dict, list, tuple)):
        raise ValueError(
            "`class_weight` needs a model with a single output (as in Keras). Received: targets with "
            f"{len(y)} outputs. Pass per-output sample_weight instead."
        )


def dataset_map(class_weight: dict, batched: bool) -> Callable:
    """A dataset map that appends Keras's class weights to (x, y) elements."""
    size = max(class_weight) + 1
    table = tf.constant([class_weight.get(c, 1.0) for c in range(size)], tf.float32)

    def add_weights(x, y):
        classes = _class_indices(y if batched else tf.expand_dims(y, 0))
        weights = tf.gather(table, tf.clip_by_value(classes, 0, size - 1))
        weights = tf.where(classes < size, weights, 1.0)
        return x, y, weights if batched else weights[0]

    return add_weights
