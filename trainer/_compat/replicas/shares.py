"""Replica shares: the factors Keras's replica scaling of losses and gradients reads while a step traces.

Keras scales every reduced loss inside a replica by 1/replicas
(`scale_loss_for_distribution`), its loss trackers undo it
(`unscale_loss_for_distribution`), and its optimizer sums the replicas'
gradients (`TFOptimizer._all_reduce_sum_gradients`). 1/replicas is each
replica's share of the global batch only when every replica holds as many
examples. Each output's loss tracker (a `Mean` per output of a multi-output
model, `CompileLoss.metrics`) weighs a batch by the traced batch's static size,
which a graph mostly lacks: then it weighs every batch 1, and logs a mean over
batches where its eager run, and the total loss, log a mean over examples; the
trainer gives it the replica's rows instead (`tracker_update`). While the
trainer traces a step, these read the factors that the trainer set for the
replica thread that traces (`replica_share`); code outside `replica_share`, or
traced outside `replica_hooks`, sees Keras's own.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import tensorflow as tf

try:  # keras/src/losses/loss.py (3.0-3.16): the 1/replicas scaling of reduced losses
    from keras.src.losses import loss as loss_module
except ImportError:  # pragma: no cover - `_compat.platform` names it before a call
    loss_module = None

try:  # keras/src/backend/tensorflow/optimizer.py (3.0-3.16): sums the replicas' gradients in a replica
    from keras.src.backend.tensorflow.optimizer import TFOptimizer
except ImportError:  # pragma: no cover
    TFOptimizer = None

try:  # keras/src/metrics/reduction_metrics.py (3.0-3.16): the loss trackers' class
    from keras.src.metrics.reduction_metrics import Mean
except ImportError:  # pragma: no cover
    Mean = None

try:  # keras/src/trainers/compile_utils.py (3.0-3.16): `metrics`, each output's loss tracker, once built
    from keras.src.trainers.compile_utils import CompileLoss
except ImportError:  # pragma: no cover
    CompileLoss = None

share = threading.local()  # .factors: `replica_share`'s arguments; .summed: gradients already summed
originals: dict[str, Callable] = {}  # Keras's functions that the hooks replaced (`replicas.HOOKS`), while installed


def factor(name: str):
    factors = getattr(share, "factors", None)
    return None if factors is None else factors[name]


def times(value, by):
    if by is None or (isinstance(by, float) and by == 1.0):
        return value
    if isinstance(value, tf.IndexedSlices):
        return tf.IndexedSlices(value.values * tf.cast(by, value.values.dtype), value.indices, value.dense_shape)
    return value * tf.cast(by, value.dtype)


def scale(value):
    by = factor("scale")
    return originals["scale"](value) if by is None else times(value, by)


def unscale(value):
    by = factor("unscale")
    return originals["unscale"](value) if by is None else times(value, by)


def all_reduce_sum_gradients(self, grads_and_vars):
    if getattr(share, "summed", False):  # the optimizer's clipping summed them (`optimizer.clip_gradients`)
        share.summed = False
        return grads_and_vars
    by = factor("gradients")
    if by is not None:
        grads_and_vars = [(None if g is None else times(g, by), v) for g, v in grads_and_vars]
    return originals["gradients"](self, grads_and_vars)


def tracker_update(self, values, sample_weight=None):
    """`Mean.update_state`: the output loss trackers of the `CompileLoss` that `replica_share(output_losses=...)`
    names weigh the value by the rows given there. Keras passes them `tree.flatten(y_pred)[0].shape[0]`
    (`CompileLoss.call`, 3.8-3.16): None, so 1, where the batch size is unknown when traced."""
    compiled, rows = factor("output_losses") or (None, None)
    if compiled is not None and any(self is tracker for tracker in compiled.metrics):
        sample_weight = rows
    return originals["tracker_update"](self, values, sample_weight)


@contextlib.contextmanager
def replica_share(*, scale=1.0, unscale=1.0, gradients=None, output_losses=None):
    """Inside a replica's trace: the factors Keras's replica scaling uses.

    Keras's own are scale=1/replicas, unscale=replicas and gradients=None
    (summed as they are). 1.0 leaves a value as it is. `output_losses`,
    (a `CompileLoss`, rows): its output loss trackers weigh each value by `rows`.
    """
    previous = getattr(share, "factors", None)
    share.factors = {"scale": scale, "unscale": unscale, "gradients": gradients,
                     "output_losses": output_losses}
    try:
        yield
    finally:
        share.factors = previous
