"""Activity regularizers: a mean or a sum over the batch, depending on the Keras version.
"""

from __future__ import annotations

import contextlib

import keras
import tensorflow as tf

from .version import KERAS_GE_3_14
from .variables import all_layers

# Activity regularizers ------------------------------------------------------------
#
# Keras 3.14+ divides an activity regularizer's value by the batch size
# (`Layer.__call__`, keras/src/layers/layer.py; checked on 3.14 and 3.15), so the
# term is a mean over the batch, which the replicas weigh as they weigh the loss.
# Keras 3.8-3.13 adds the sum over the batch: weighed as a mean, on R replicas
# it would count about 1/R as much as on one device. `activity_share` scales it,
# while a replica traces, by the global batch's examples over the replica's rows:
# a mean times the examples, which the replicas add up to the one-device sum.


ACTIVITY_SUMS = not KERAS_GE_3_14  # the activity regularizer is a sum over the batch


class _ScaledActivity:
    """A layer's activity regularizer, times `examples` / the rows of its input."""

    def __init__(self, regularizer, examples):
        self.regularizer, self.examples = regularizer, examples

    def __call__(self, output):
        loss = self.regularizer(output)
        if output.shape.rank == 0:
            return loss
        rows = tf.cast(tf.shape(output)[0], loss.dtype)
        return loss * tf.math.divide_no_nan(tf.cast(self.examples, loss.dtype), rows)


def activity_layers(model: keras.Model) -> list:
    """The layers whose activity regularizer sums over the batch (none on Keras 3.14+)."""
    if not ACTIVITY_SUMS:
        return []
    return [layer for layer in all_layers(model) if getattr(layer, "activity_regularizer", None) is not None]


@contextlib.contextmanager
def activity_share(model: keras.Model, examples):
    """While a replica traces `model`'s forward pass: each activity regularizer that sums over the batch is
    scaled by `examples` (the examples of the global batch) over the rows its layer sees. None: as Keras has it."""
    layers = activity_layers(model) if examples is not None else []
    for layer in layers:
        layer.activity_regularizer = _ScaledActivity(layer.activity_regularizer, examples)
    try:
        yield
    finally:
        for layer in layers:
            layer.activity_regularizer = layer.activity_regularizer.regularizer
