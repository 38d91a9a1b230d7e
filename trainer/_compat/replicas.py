"""Replica shares: Keras's replica scaling of losses and gradients, its optimizer's clipping and
accumulation, synchronized BatchNormalization's statistics, and the updates of variables summed over
replicas, hooked while the trainer traces a step.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import tensorflow as tf

from .patches import Patches
from .sharded import _PSExtended, is_sharded


try:  # keras/src/losses/loss.py (3.0-3.15): the 1/replicas scaling of reduced losses
    from keras.src.losses import loss as _loss_module
except ImportError:  # pragma: no cover - a Keras without it has no hook to take
    _loss_module = None

try:  # keras/src/backend/tensorflow/optimizer.py (3.0-3.15): sums the replicas' gradients in a replica
    from keras.src.backend.tensorflow.optimizer import TFOptimizer as _TFOptimizer
except ImportError:  # pragma: no cover
    _TFOptimizer = None

try:  # keras/src/backend/tensorflow/nn.py (3.8-3.15): BatchNormalization(synchronized=True)'s statistics
    from keras.src.backend.tensorflow import nn as _tf_nn
except ImportError:  # pragma: no cover
    _tf_nn = None

try:  # keras/src/optimizers/base_optimizer.py (3.0-3.15): `apply` and `_clip_gradients`
    from keras.src.optimizers.base_optimizer import BaseOptimizer as _BaseOptimizer
except ImportError:  # pragma: no cover
    _BaseOptimizer = None

try:  # keras/src/backend/common/variables.py (3.8-3.15): `assign_add` is `assign(self + value)`
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.common.variables import Variable as _KerasVariable
except ImportError:  # pragma: no cover
    _KerasVariable = None

# tensorflow/python/distribute/merge_call_interim.py (2.9-2.21), which Keras's TF optimizer calls as
# `tf.__internal__.distribute.interim.maybe_merge_call`.
_interim = getattr(getattr(getattr(tf, "__internal__", None), "distribute", None), "interim", None)


# Replica shares ----------------------------------------------------------------
#
# Keras scales every reduced loss inside a replica by 1/replicas
# (`scale_loss_for_distribution`), its loss trackers undo it
# (`unscale_loss_for_distribution`), and its optimizer sums the replicas'
# gradients (`TFOptimizer._all_reduce_sum_gradients`). 1/replicas is each
# replica's share of the global batch only when every replica holds as many
# examples. While the trainer traces a step, the three read the factors that
# the trainer set for the replica thread that traces (`replica_share`); code
# outside `replica_share`, or traced outside `replica_hooks`, sees Keras's own.
#
# Keras's optimizer is also wrong in a replica of several in two ways, which
# the same hooks put right:
# - It clips (`clipnorm`, `clipvalue`, `global_clipnorm`) each replica's
#   gradient, before the sum. `_clip_gradients` sums them first, so the global
#   gradient is clipped, as on one device; the sum then is not taken again.
# - Gradient accumulation and `ema_overwrite_frequency` update variables
#   inside a `cond`, through `merge_call`, which a replica cannot do in a graph
#   ("merge_call called while defining a new graph"), and the EMA update fails
#   under CentralStorageStrategy. With those options `apply` sums the replicas'
#   gradients and applies them once, in cross-replica context, where Keras's
#   merge calls (`maybe_merge_call`) are plain calls.

_share = threading.local()  # .factors: {"scale", "unscale", "gradients"}; .summed: gradients already summed
_originals: dict[str, Callable] = {}  # Keras's functions that `_PATCHES` (below) replaced, while installed


def _factor(name: str):
    factors = getattr(_share, "factors", None)
    return None if factors is None else factors[name]


def _times(value, factor):
    if factor is None or (isinstance(factor, float) and factor == 1.0):
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
    if getattr(_share, "summed", False):  # `_clip_gradients` summed them
        _share.summed = False
        return grads_and_vars
    factor = _factor("gradients")
    if factor is not None:
        grads_and_vars = [(None if g is None else _times(g, factor), v) for g, v in grads_and_vars]
    return _originals["gradients"](self, grads_and_vars)


def _compute_moments_sync(x, axes, keepdims):
    """The mean and variance of the global batch, over every replica's rows, as one device computes them.

    Keras's synchronized BatchNormalization all-reduces each replica's sum,
    sum of squares and count, and takes the variance as E[x^2] - E[x]^2, which
    rounds otherwise than one device's E[(x - E[x])^2] (`tf.nn.moments`), and
    far otherwise for features whose mean is large against their spread. Here
    each replica sums its rows and their squared deviations from its own mean,
    and every replica gets all the replicas' (count, sum, deviations)
    (`_gathered`); they combine as Chan et al.'s parallel variance does, from
    differences of means, never of large squares.

    The gradient is written out, for one round between the replicas and a
    handful of ops (autodiff's through the combination took some sixty a
    layer, which cost more than the round itself on CPU replicas): a row's
    gradient is (G_mean + 2 (x - mean) G_variance) / examples, where G is the
    replicas' sum of the upstream gradients of the mean and variance. In a
    model's own train_step the replicas' gradients are weighed after the tape
    (`_all_reduce_sum_gradients`), by each replica's share of the global
    batch, but that sum carries every replica's upstream to every other
    unweighed: each replica's part is weighed there, and the sum divided by
    the receiver's weight, which the optimizer then applies.
    """
    context = _replicas()
    if context is None:
        return _originals["moments_sync"](x, axes, keepdims)
    factor = _factor("gradients")

    @tf.custom_gradient
    def moments(x):
        total = tf.reduce_sum(x, axis=axes, keepdims=True)
        count = tf.cast(tf.size(x, tf.int64) // tf.maximum(tf.size(total, tf.int64), 1), x.dtype)
        deviations = tf.reduce_sum(tf.math.squared_difference(x, tf.math.divide_no_nan(total, count)),
                                   axis=axes, keepdims=True)
        own = tf.stack([tf.broadcast_to(count, tf.shape(total)), total, deviations])
        counts, totals, squares = tf.unstack(_gathered(context, own), axis=1)
        examples = tf.reduce_sum(counts, 0)
        mean = tf.reduce_sum(totals, 0) / examples
        spread = tf.reduce_sum(counts * tf.math.squared_difference(tf.math.divide_no_nan(totals, counts), mean), 0)
        variance = (tf.reduce_sum(squares, 0) + spread) / examples

        def grad(upstream_mean, upstream_variance):
            upstream = tf.stack([tf.zeros_like(mean) if g is None else g for g in (upstream_mean, upstream_variance)])
            if factor is None:
                summed = _replica_sum(context, upstream)
            else:
                weight = tf.cast(factor, upstream.dtype)
                summed = tf.math.divide_no_nan(_replica_sum(context, upstream * weight), weight)
            # After the round, not before: left free, TensorFlow's executor takes x - mean as soon as the mean is
            # known, in the forward pass, where it holds a core that a replica racing to the next round needs,
            # and an activation-sized tensor until the backward (bench/exact_layers_cost.py: 1.08x -> 1.02-1.04x
            # the step of per-replica statistics on 4 CPU replicas).
            with tf.control_dependencies([summed]):
                centered = x - mean
            return centered * (2.0 * summed[1] / examples) + summed[0] / examples  # three passes over x

        return (mean, variance), grad

    mean, variance = moments(x)
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return mean, variance


def _in_process(strategy) -> bool:
    """Whether every replica is a CPU of this process, where a sum or gather is plain ops between devices:
    MirroredStrategy's collectives cost about 0.2 ms a call there (bench/exact_layers_cost.py)."""
    return (isinstance(strategy, tf.distribute.MirroredStrategy)
            and all(tf.DeviceSpec.from_string(d).device_type == "CPU" for d in strategy.extended.worker_devices))


def _replica_sum(context, value):
    """The replicas' sum of `value`: between CPUs of one process each replica adds the parts itself, in replica
    order, so every replica holds the same bits; elsewhere (GPUs, workers) the strategy's own all-reduce."""
    if not _in_process(context.strategy):
        return context.all_reduce(tf.distribute.ReduceOp.SUM, value)
    return _on_each_replica(context, value, tf.add_n)


def _gathered(context, value):
    """Every replica's `value`, stacked in replica order (no gradient)."""
    if _in_process(context.strategy):
        return _on_each_replica(context, value, tf.stack)
    replicas = context.num_replicas_in_sync  # each part in a slot of its own, and the slots summed
    slot = tf.reshape(tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=value.dtype),
                      [replicas] + [1] * value.shape.rank)
    return context.all_reduce(tf.distribute.ReduceOp.SUM, slot * value[None])


def _on_each_replica(context, value, combine):
    """`combine([part, ...])` of the replicas' parts of `value`, on each replica's own device."""

    def on_each(strategy, parts):
        parts = list(strategy.experimental_local_results(parts))
        results = []
        for device in strategy.extended.worker_devices:
            with tf.device(device):
                results.append(combine(parts))
        return strategy.experimental_distribute_values_from_function(
            lambda replica: results[replica.replica_id_in_sync_group])

    return context.merge_call(on_each, args=(value,))


def _replicas():
    """The replica context of a replica of several, else None."""
    context = tf.distribute.get_replica_context()
    return context if context is not None and context.num_replicas_in_sync > 1 else None


def _summed(context, grads):
    """The replicas' gradients, each weighed by `replica_share(gradients=...)`, summed (None stays None)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:  # Keras's own apply then says which variables have no gradient
        return list(grads)
    factor = _factor("gradients")
    summed = context.all_reduce(tf.distribute.ReduceOp.SUM, [_times(grads[i], factor) for i in present])
    out = list(grads)
    for i, g in zip(present, summed):
        out[i] = g
    return out


def _clips(optimizer) -> bool:
    return any(getattr(optimizer, name, None) for name in ("clipnorm", "clipvalue", "global_clipnorm"))


def _clip_gradients(self, grads):
    context = _replicas()
    if context is not None and _clips(self):
        grads = _summed(context, grads)
        _share.summed = True
    return _originals["clip"](self, grads)


def needs_one_apply(optimizer) -> bool:
    """Whether Keras's `apply` cannot run in a replica of several: gradient accumulation and
    EMA overwrite update inside a `cond`, and the EMA update writes a variable that
    CentralStorageStrategy aggregates."""
    return bool(getattr(optimizer, "gradient_accumulation_steps", None) or getattr(optimizer, "use_ema", False))


def _apply(self, grads, trainable_variables=None):
    if not self.built and trainable_variables is not None:
        # An optimizer the trainer did not build (a GAN's own) builds on its first apply, inside
        # the step; its variables are created eagerly, outside the step's loop and conds, so that
        # MirroredStrategy can initialize their copies.
        trainable_variables = list(trainable_variables)
        with tf.init_scope():
            self.build(trainable_variables)
        self.built = True
    # Under any strategy, also one replica per parameter-server worker (which merge-calls too).
    context = tf.distribute.get_replica_context() if tf.distribute.has_strategy() else None
    if context is None or not needs_one_apply(self):
        return _originals["apply"](self, grads, trainable_variables)
    grads = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    summed = _summed(context, grads)

    def apply_once(strategy, *present_grads):
        # The replicas hold the same sums; replica 0's are applied to every copy of each variable.
        full = [None] * len(grads)
        for i, g in zip(present, present_grads):
            full[i] = strategy.experimental_local_results(g)[0]
        with _merge_calls_inline():
            _originals["apply"](self, full, trainable_variables)

    context.merge_call(apply_once, args=tuple(summed[i] for i in present))


def _maybe_merge_call(fn, strategy, *args, **kwargs):
    if tf.distribute.in_cross_replica_context():  # a merge call from cross-replica context is the call
        return fn(strategy, *args, **kwargs)
    return _originals["merge_call"](fn, strategy, *args, **kwargs)


@contextlib.contextmanager
def _merge_calls_inline():
    _interim.maybe_merge_call = _maybe_merge_call
    try:
        yield
    finally:
        _interim.maybe_merge_call = _originals["merge_call"]


def _ps_update(self, var, fn, args, kwargs, group):
    if not is_sharded(var):
        return _originals["ps_update"](self, var, fn, args, kwargs, group)
    result = fn(var, *self._select_single_value(args), **self._select_single_value(kwargs))
    return result if group else tf.nest.map_structure(self._local_results, result)


# Variables summed over replicas -------------------------------------------------
#
# Keras's `assign_add` and `assign_sub` are `assign(self + value)` and
# `assign(self - value)`. A variable made with `add_weight(aggregation="sum")`
# is, under MirroredStrategy, an on-write MirroredVariable, and under
# CentralStorageStrategy one copy the replicas share: each replica's `assign`
# hands the strategy its new value whole, and the strategy sums them, so R
# replicas leave R * old + the updates. A count of the examples a layer has
# seen then grows geometrically: 240 for 64 examples in 4 steps on 2 replicas,
# where one device counts 64 (Keras's own fit in the strategy's scope gives 240
# too). tf.Variable's own `assign_add` sums the updates alone, as one device
# adds the whole batch's: in a replica, the hooks hand it the update. Every
# other variable (on-read ones, such as Keras 3.10+'s metrics, and those
# averaged or taken from the first replica, where both ways agree) keeps Keras's.


def _sums_updates(variable) -> bool:
    """A variable summed over replicas and not kept per replica (a MirroredVariable, or the one copy
    CentralStorageStrategy's replicas share), updated inside a replica."""
    return (getattr(variable, "aggregation", None) == tf.VariableAggregation.SUM
            and variable.synchronization != tf.VariableSynchronization.ON_READ
            and tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
            and not in_stateless_scope())


def _summed_update(name: str):
    def update(self, value):
        backing = getattr(self, "_value", None)
        if not _sums_updates(backing):
            return _originals[name](self, value)
        value = tf.cast(self._convert_to_tensor(value, dtype=self.dtype), backing.dtype)
        return getattr(backing, name)(tf.broadcast_to(value, self.shape))  # as `self + value` broadcasts

    return update


_LOSS = "keras/src/losses/loss.py"
_TF_OPTIMIZER = "TFOptimizer (keras/src/backend/tensorflow/optimizer.py)"
_OPTIMIZER = "BaseOptimizer (keras/src/optimizers/base_optimizer.py)"
_VARIABLE = "Variable (keras/src/backend/common/variables.py)"
_HOOKS = (  # (key, owner, attribute, replacement, where)
    ("scale", _loss_module, "scale_loss_for_distribution", _scale, _LOSS),
    ("unscale", _loss_module, "unscale_loss_for_distribution", _unscale, _LOSS),
    ("gradients", _TFOptimizer, "_all_reduce_sum_gradients", _all_reduce_sum_gradients, _TF_OPTIMIZER),
    ("clip", _BaseOptimizer, "_clip_gradients", _clip_gradients, _OPTIMIZER),
    ("apply", _BaseOptimizer, "apply", _apply, _OPTIMIZER),
    # replaced only inside `_apply`'s cross-replica call
    ("merge_call", _interim, "maybe_merge_call", None, "tensorflow/python/distribute/merge_call_interim.py"),
    ("moments_sync", _tf_nn, "_compute_moments_sync", _compute_moments_sync, "keras/src/backend/tensorflow/nn.py"),
    ("assign_add", _KerasVariable, "assign_add", _summed_update("assign_add"), _VARIABLE),
    ("assign_sub", _KerasVariable, "assign_sub", _summed_update("assign_sub"), _VARIABLE),
) + ((("ps_update", _PSExtended, "_update", _ps_update,
       "ParameterServerStrategyExtended (tensorflow/python/distribute/parameter_server_strategy.py)"),)
     if _PSExtended is not None else ())
_PATCHES = Patches("the replicas' loss and gradient shares, clipping, accumulation, synchronized statistics and "
                   "summed variables", _HOOKS, _originals)


@contextlib.contextmanager
def replica_hooks():
    """While tracing step functions: Keras's replica scaling reads `replica_share`'s factors,
    its optimizer clips and accumulates the replicas' summed gradients, a variable summed over
    replicas adds the replicas' updates, and sharded variables are updated whole (also around the
    EMA overwrite at the end of training, in cross-replica context, where the other hooks are
    Keras's own functions).

    Installed only for the duration (Keras's functions are put back after), and
    only the threads inside `replica_share` see other factors than Keras's.
    """
    with _PATCHES.installed():
        yield


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
