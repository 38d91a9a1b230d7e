"""Synchronized BatchNormalization's statistics over the global batch, as one device computes them."""

from __future__ import annotations

import tensorflow as tf

from . import collective  # read when a step traces: bench/exact_layers_cost.py replaces its sums
from .shares import factor, originals

from ..version import KERAS_GE_3_16

# BatchNormalization(synchronized=True)'s statistics: keras/src/backend/tensorflow/ops/nn.py (3.16), and
# backend/tensorflow/nn.py before
NN_FILE = f"keras/src/backend/tensorflow/{'ops/' if KERAS_GE_3_16 else ''}nn.py"
try:
    if KERAS_GE_3_16:
        from keras.src.backend.tensorflow.ops import nn as tf_nn
    else:
        from keras.src.backend.tensorflow import nn as tf_nn
except ImportError:  # pragma: no cover - `_compat.platform` names it before a call
    tf_nn = None


def compute_moments_sync(x, axes, keepdims):
    """The mean and variance of the global batch, over every replica's rows, as one device computes them.

    Keras's synchronized BatchNormalization all-reduces each replica's sum,
    sum of squares and count, and takes the variance as E[x^2] - E[x]^2, which
    rounds otherwise than one device's E[(x - E[x])^2] (`tf.nn.moments`), and
    far otherwise for features whose mean is large against their spread. Here
    each replica sums its rows and their squared deviations from its own mean,
    and every replica gets all the replicas' (count, sum, deviations)
    (`collective.gathered`); they combine as Chan et al.'s parallel variance does, from
    differences of means, never of large squares.

    The gradient is written out, for one round between the replicas and a
    handful of ops (autodiff's through the combination took some sixty a
    layer, which cost more than the round itself on CPU replicas): a row's
    gradient is (G_mean + 2 (x - mean) G_variance) / examples, where G is the
    replicas' sum of the upstream gradients of the mean and variance. In a
    model's own train_step the replicas' gradients are weighed after the tape
    (`shares.all_reduce_sum_gradients`), by each replica's share of the global
    batch, but that sum carries every replica's upstream to every other
    unweighed: each replica's part is weighed there, and the sum divided by
    the receiver's weight, which the optimizer then applies.
    """
    context = collective.replicas()
    if context is None:
        return originals["moments_sync"](x, axes, keepdims)
    weight_of = factor("gradients")

    @tf.custom_gradient
    def moments(x):
        total = tf.reduce_sum(x, axis=axes, keepdims=True)
        count = tf.cast(tf.size(x, tf.int64) // tf.maximum(tf.size(total, tf.int64), 1), x.dtype)
        deviations = tf.reduce_sum(tf.math.squared_difference(x, tf.math.divide_no_nan(total, count)),
                                   axis=axes, keepdims=True)
        own = tf.stack([tf.broadcast_to(count, tf.shape(total)), total, deviations])
        counts, totals, squares = tf.unstack(collective.gathered(context, own), axis=1)
        examples = tf.reduce_sum(counts, 0)
        mean = tf.reduce_sum(totals, 0) / examples
        spread = tf.reduce_sum(counts * tf.math.squared_difference(tf.math.divide_no_nan(totals, counts), mean), 0)
        variance = (tf.reduce_sum(squares, 0) + spread) / examples

        def grad(upstream_mean, upstream_variance):
            upstream = tf.stack([tf.zeros_like(mean) if g is None else g for g in (upstream_mean, upstream_variance)])
            if weight_of is None:
                summed = collective.replica_sum(context, upstream)
            else:
                weight = tf.cast(weight_of, upstream.dtype)
                summed = tf.math.divide_no_nan(collective.replica_sum(context, upstream * weight), weight)
            # After the round, not before: left free, TensorFlow's executor takes x - mean as soon as the mean is
            # known, in the forward pass, where it holds a core that a replica racing to the next round needs,
            # and an activation-sized tensor until the backward (docs/performance.md: what one device's numbers cost).
            with tf.control_dependencies([summed]):
                centered = x - mean
            return centered * (2.0 * summed[1] / examples) + summed[0] / examples  # three passes over x

        return (mean, variance), grad

    mean, variance = moments(x)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return mean, variance
