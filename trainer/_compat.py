"""The private Keras and TensorFlow attributes the trainer reads, in one place.

Each names the versions it was checked on (the supported range is setup.cfg's,
tested at both ends by CI); each has a fallback or fails with a message that
names it, so a release that moves one breaks here, not somewhere in a step
function.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import random
import threading
import warnings
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from trainer.quiet import startup_notices_hidden

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

# tensorflow/python/distribute/merge_call_interim.py (2.9-2.21), which Keras's TF optimizer calls as
# `tf.__internal__.distribute.interim.maybe_merge_call`.
_interim = getattr(getattr(getattr(tf, "__internal__", None), "distribute", None), "interim", None)

try:  # tensorflow/python/distribute/{sharded_variable,parameter_server_strategy}.py (2.18-2.21): what a
    # ParameterServerStrategy's variable_partitioner makes, and the update path that cannot take it
    from tensorflow.python.distribute.parameter_server_strategy import (
        ParameterServerStrategyExtended as _PSExtended,
    )
    from tensorflow.python.distribute.sharded_variable import ShardedVariable as _ShardedVariable
except ImportError:  # pragma: no cover - then no variable is ever sharded
    _PSExtended = _ShardedVariable = None

try:  # tensorflow/python/distribute/cluster_resolver/slurm_cluster_resolver.py (2.18-2.21): Slurm's
    # compressed host lists ("gpu[01-04],cpu7") and tasks per node ("4(x2),2"), parsed as TensorFlow parses them
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        expand_hostlist,
        expand_tasks_per_node,
    )
except ImportError:  # pragma: no cover
    def expand_hostlist(hostlist: str) -> list[str]:
        raise RuntimeError("This TensorFlow has no Slurm host-list parser; set TF_CONFIG for each task instead.")

    expand_tasks_per_node = expand_hostlist

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
_installed = [0]  # nesting depth of `replica_hooks`
_originals: dict[str, Callable] = {}


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
    and one all-reduce hands every replica all the replicas' (count, sum,
    deviations), each in a slot of its own; they combine as Chan et al.'s
    parallel variance does, from differences of means, never of large squares.

    In a model's own train_step the replicas' gradients are weighed after the
    tape (`_all_reduce_sum_gradients`), by each replica's share of the global
    batch, but the all-reduce carries every replica's gradient to every other
    unweighed: `_weighed_sum` weighs each replica's part there, and divides by
    the receiver's weight, which the optimizer then applies.
    """
    context = _replicas()
    if context is None:
        return _originals["moments_sync"](x, axes, keepdims)
    total = tf.reduce_sum(x, axis=axes, keepdims=True)
    count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype) * tf.ones_like(total)
    own_mean = tf.stop_gradient(tf.math.divide_no_nan(total, count))
    deviations = tf.reduce_sum(tf.math.squared_difference(x, own_mean), axis=axes, keepdims=True)
    replicas = context.num_replicas_in_sync
    slot = tf.reshape(tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=x.dtype),
                      [replicas] + [1] * (x.shape.rank + 1))
    parts = _weighed_sum(context, slot * tf.stack([count, total, deviations])[None], _factor("gradients"))
    counts, totals, squares = parts[:, 0], parts[:, 1], parts[:, 2]
    examples = tf.reduce_sum(counts, 0)
    mean = tf.reduce_sum(totals, 0) / examples
    spread = tf.reduce_sum(counts * tf.math.squared_difference(tf.math.divide_no_nan(totals, counts), mean), 0)
    variance = (tf.reduce_sum(squares, 0) + spread) / examples
    if not keepdims:
        mean, variance = tf.squeeze(mean, axes), tf.squeeze(variance, axes)
    return mean, variance


_IN_PROCESS_SUM = True  # `_replica_sum` between CPUs of one process; bench/exact_layers_cost.py turns it off


def _weighed_sum(context, value, factor):
    """The replicas' sum of `value`. Its gradient is the replicas' sum of theirs, with a gradient `factor` (see
    `_compute_moments_sync`) each replica's part weighed by it."""

    @tf.custom_gradient
    def summed(v):
        def grad(upstream):
            if factor is None:
                return _replica_sum(context, upstream)
            weight = tf.cast(factor, upstream.dtype)
            return tf.math.divide_no_nan(_replica_sum(context, upstream * weight), weight)

        return _replica_sum(context, v), grad

    return summed(value)


def _replica_sum(context, value):
    """The replicas' sum of `value`. Where every replica is a CPU of this process, the parts are added on the
    first and copied back, in the process: MirroredStrategy's collective all-reduce costs about 0.2 ms a call
    there (bench/exact_layers_cost.py). Elsewhere (GPUs, workers) the strategy's own all-reduce."""
    strategy = context.strategy
    devices = strategy.extended.worker_devices
    if not (_IN_PROCESS_SUM and isinstance(strategy, tf.distribute.MirroredStrategy)
            and all(tf.DeviceSpec.from_string(d).device_type == "CPU" for d in devices)):
        return context.all_reduce(tf.distribute.ReduceOp.SUM, value)

    def add_on_first(strategy, parts):
        with tf.device(devices[0]):
            total = tf.add_n(strategy.experimental_local_results(parts))
        copies = []
        for device in devices:
            with tf.device(device):
                copies.append(tf.identity(total))
        return strategy.experimental_distribute_values_from_function(
            lambda replica: copies[replica.replica_id_in_sync_group])

    return context.merge_call(add_on_first, args=(value,))


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


# Sharded variables ---------------------------------------------------------------
#
# Under a ParameterServerStrategy with a `variable_partitioner`, a variable made
# in its scope is a ShardedVariable: a list of variables, one slice of the first
# axis each, on the ps tasks in turn. Layers read it whole (it converts to the
# concatenation of its shards), and its `assign` ops split the new value and
# write each shard where it lives. Two things Keras 3 does with a variable fail
# on it: a gradient tape takes the gradient of a Keras variable through its
# backing variable's `handle`, which a ShardedVariable has not; and the
# strategy's `extended.update`, through which Keras's optimizer applies every
# update (the step, weight decay, accumulation, EMA), colocates the update with
# the variable, which a ShardedVariable cannot be. `gradients` takes the
# gradient of each shard and puts them together; `_ps_update` runs the update
# on the whole ShardedVariable.


def is_sharded(value: Any) -> bool:
    """Whether a backing variable is a ShardedVariable (a ParameterServerStrategy's partitioned variable)."""
    return _ShardedVariable is not None and isinstance(value, _ShardedVariable)


def gradients(tape: tf.GradientTape, target: Any, variables: list) -> list:
    """`tape.gradient(target, variables)` for Keras variables, sharded ones included.

    A sharded variable's gradient is its shards' gradients put together along
    the first axis: sparse when every shard's is (an Embedding's), else dense.
    """
    shards = [list(backing(v).variables) if is_sharded(backing(v)) else None for v in variables]
    if not any(shards):
        return tape.gradient(target, variables)
    sources = [parts if parts else v for v, parts in zip(variables, shards)]
    return [_joined(g, backing(v)) if parts else g
            for g, v, parts in zip(tape.gradient(target, sources), variables, shards)]


def _joined(parts: list, sharded: Any) -> Any:
    if all(part is None for part in parts):
        return None
    offsets = np.cumsum([0] + [int(s.shape[0]) for s in sharded.variables[:-1]])
    if all(isinstance(part, tf.IndexedSlices) for part in parts):
        return tf.IndexedSlices(tf.concat([part.values for part in parts], axis=0),
                                tf.concat([part.indices + offset for part, offset in zip(parts, offsets)], axis=0),
                                tf.constant(sharded.shape.as_list(), dtype=parts[0].indices.dtype))
    return tf.concat([tf.zeros(s.shape, s.dtype) if part is None else tf.convert_to_tensor(part)
                      for part, s in zip(parts, sharded.variables)], axis=0)


def _ps_update(self, var, fn, args, kwargs, group):
    if not is_sharded(var):
        return _originals["ps_update"](self, var, fn, args, kwargs, group)
    result = fn(var, *self._select_single_value(args), **self._select_single_value(kwargs))
    return result if group else tf.nest.map_structure(self._local_results, result)


_HOOKS = (  # (key, owner, attribute, replacement)
    ("scale", _loss_module, "scale_loss_for_distribution", _scale),
    ("unscale", _loss_module, "unscale_loss_for_distribution", _unscale),
    ("gradients", _TFOptimizer, "_all_reduce_sum_gradients", _all_reduce_sum_gradients),
    ("clip", _BaseOptimizer, "_clip_gradients", _clip_gradients),
    ("apply", _BaseOptimizer, "apply", _apply),
    ("merge_call", _interim, "maybe_merge_call", None),  # replaced only inside `_apply`'s cross-replica call
    ("moments_sync", _tf_nn, "_compute_moments_sync", _compute_moments_sync),
) + ((("ps_update", _PSExtended, "_update", _ps_update),) if _PSExtended is not None else ())


def replica_hooks_supported() -> bool:
    return all(owner is not None and hasattr(owner, attribute) for _, owner, attribute, _ in _HOOKS)


@contextlib.contextmanager
def replica_hooks():
    """While tracing step functions: Keras's replica scaling reads `replica_share`'s factors,
    its optimizer clips and accumulates the replicas' summed gradients, and updates sharded
    variables whole (also around the EMA overwrite at the end of training, in cross-replica
    context, where the other hooks are Keras's own functions).

    Installed only for the duration (Keras's functions are put back after), and
    only the threads inside `replica_share` see other factors than Keras's.
    """
    if not replica_hooks_supported():  # pragma: no cover - checked on Keras 3.15
        yield
        return
    if _installed[0] == 0:
        for key, owner, attribute, replacement in _HOOKS:
            _originals[key] = getattr(owner, attribute)
            if replacement is not None:
                setattr(owner, attribute, replacement)
    _installed[0] += 1
    try:
        yield
    finally:
        _installed[0] -= 1
        if _installed[0] == 0:
            for key, owner, attribute, replacement in _HOOKS:
                original = _originals.pop(key)
                if replacement is not None:
                    setattr(owner, attribute, original)


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


def step_counter(optimizer) -> Any:
    """The variable that counts `apply` calls; `optimizer.iterations` divides it by the accumulation steps."""
    return getattr(optimizer, "_iterations", optimizer.iterations)


def all_layers(model: keras.Model) -> list:
    """The model and every layer inside it, nested ones included (`Layer._flatten_layers`, 3.0-3.15)."""
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=True, recursive=True))
    found = [model]  # pragma: no cover - the public, shallower walk
    for layer in getattr(model, "layers", []):
        found += all_layers(layer) if isinstance(layer, keras.Model) else [layer]
    return found


# Global random state -----------------------------------------------------------
#
# Keras draws initializer and dropout seeds from Python's `random`
# (`make_default_seed`), and `keras.random` calls without a seed from a global
# SeedGenerator kept in `global_state` with the seed `set_random_seed` stored
# (keras/src/random/seed_generator.py, keras/src/utils/rng_utils.py; 3.0-3.15).
# TensorFlow's global seed is left alone: Keras's TF backend draws stateless
# random numbers from those seeds, and `tf.random.set_seed` clears the kernels
# of the user's random ops, which no restore can undo.

try:
    from keras.src.backend.common import global_state as _global_state
except ImportError:  # pragma: no cover
    _global_state = None
_KERAS_RANDOM_ATTRIBUTES = ("global_random_seed", "global_seed_generator")


@contextlib.contextmanager
def global_random_state_kept():
    """Python's, NumPy's and Keras's global random generators, as they were before the block, after it."""
    python, numpy_state = random.getstate(), np.random.get_state()
    keras_state = ({} if _global_state is None else
                   {name: _global_state.get_global_attribute(name) for name in _KERAS_RANDOM_ATTRIBUTES})
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
        for name, value in keras_state.items():
            _global_state.set_global_attribute(name, value)


@contextlib.contextmanager
def seeded(seed: int | None):
    """Inside: the global generators seeded as `keras.utils.set_random_seed(seed)` seeds them (TensorFlow's
    aside); after: as they were. `seed=None` seeds nothing."""
    if seed is None:
        yield
        return
    with global_random_state_kept():
        random.seed(seed)
        np.random.seed(seed)
        if _global_state is not None:
            _global_state.set_global_attribute("global_random_seed", seed)
            _global_state.set_global_attribute("global_seed_generator", None)  # made again from the seeds above
        yield


# Keras's random draws ----------------------------------------------------------
#
# Every random number of a Keras layer or train step comes from the TensorFlow
# backend's functions `normal`, `uniform`, `randint`, `truncated_normal` and
# `dropout` (keras/src/backend/tensorflow/random.py, 3.8-3.15), looked up on
# that module at each call (`keras.random.*`, and preprocessing layers through
# `self.backend.random`). Each turns its seed (a SeedGenerator, an int or None)
# into a stateless seed with `_cast_seed(draw_seed(seed))`, then calls
# TensorFlow's stateless op. `trainer.draws` replaces the five while a step is
# traced, and turns seeds the same way (`keras_seed`).

try:
    from keras.src.backend.tensorflow import random as _tf_random
    from keras.src.random.seed_generator import draw_seed as _draw_seed
except ImportError:  # pragma: no cover
    _tf_random = _draw_seed = None
RANDOM_FUNCTIONS = ("normal", "uniform", "randint", "truncated_normal", "dropout")


def keras_random_module() -> Any:
    """The module whose functions draw Keras's random numbers on TensorFlow, or None if it is not there."""
    if _tf_random is None or not all(hasattr(_tf_random, name) for name in (*RANDOM_FUNCTIONS, "_cast_seed")):
        return None
    return _tf_random


def keras_seed(seed: Any) -> tf.Tensor:
    """The stateless seed (int32[2]) Keras's TensorFlow backend draws with for `seed`, advancing a SeedGenerator
    as its draw would."""
    return _tf_random._cast_seed(_draw_seed(seed))


def noise_shape(inputs: Any, shape: Any) -> Any:
    """Keras's concrete shape of a dropout mask for `inputs` (its `noise_shape`, or the inputs' own)."""
    return _tf_random._get_concrete_noise_shape(inputs, shape)


# Activity regularizers ------------------------------------------------------------
#
# Keras 3.14+ divides an activity regularizer's value by the batch size
# (`Layer.__call__`, keras/src/layers/layer.py; checked on 3.14 and 3.15), so the
# term is a mean over the batch, which the replicas weigh as they weigh the loss.
# Keras 3.8-3.13 adds the sum over the batch: weighed as a mean, on R replicas
# it would count about 1/R as much as on one device. `activity_share` scales it,
# while a replica traces, by the global batch's examples over the replica's rows:
# a mean times the examples, which the replicas add up to the one-device sum.


def _keras_version() -> tuple[int, ...]:
    parts = []
    for part in keras.version().split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


KERAS_VERSION = _keras_version()  # (major, minor)
ACTIVITY_SUMS = KERAS_VERSION < (3, 14)  # the activity regularizer is a sum over the batch


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
    instance for the duration (Keras 3.0-3.15 metrics are plain objects),
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


def requested_initial_epoch(model: keras.Model) -> int | None:
    """The epoch a callback asked fit to start from in `on_train_begin`, by setting `model._initial_epoch`:
    Keras's BackupAndRestore does, and `Model.fit` starts from it when set (keras/src/backend/tensorflow/
    trainer.py `fit`: `self._initial_epoch or initial_epoch`; 3.8-3.15)."""
    return getattr(model, "_initial_epoch", None)


# A dict of data for a model's inputs ----------------------------------------------
#
# Keras checks a dict of data against a model's inputs by name, then feeds it
# by another rule (keras/src/layers/input_spec.py `assert_input_compatibility`
# and keras/src/models/functional.py `_standardize_inputs`; the same on 3.8 and
# 3.15):
# - the check: when every spec of `model.input_spec` has a name (a Functional's
#   Input names, or for a model built on a dict of Inputs its sorted keys),
#   each name must be a key of the data ("Missing data for input"); other keys
#   pass;
# - the feed, for a model built on a list of Inputs: `data[name]` for each
#   input; other keys are ignored;
# - the feed, for a model built on a dict of Inputs: the data's values in
#   sorted key order, zipped with the inputs in sorted key order (after a
#   warning when the keys differ), so a key beyond the inputs that sorts among
#   them moves the later inputs' data along by one.
# A Sequential has no input_spec; its Functional, built on one Input, takes
# `data[name]` or fails. Without names, the dict's values go by position,
# sorted by key.


@dataclasses.dataclass(frozen=True)
class DictFeed:
    """How Keras feeds a dict of data to a model's inputs."""

    pairs: list  # (data key, input name, symbolic input) for each input, in `model.inputs`' order
    missing: list  # input names the data lacks (Keras refuses the dict)


def dict_feed(model: keras.Model, keys) -> DictFeed | None:
    """How Keras feeds a dict of data with `keys` to `model`'s inputs; None where it feeds its values by
    position (an input without a name, or a model not built on keras.Input)."""
    try:
        specs = keras.tree.flatten(model.input_spec or [])
        tensors = list(model.inputs or [])
    except (AttributeError, ValueError):
        return None
    names = [getattr(spec, "name", None) for spec in specs]
    if not specs and len(tensors) == 1:  # a Sequential: its Functional takes a dict's data by the input's name
        names = [tensors[0].name]
    if not names or not all(names) or len(names) != len(tensors):
        return None
    missing = [name for name in names if name not in keys]
    struct = getattr(model, "input", None)
    if isinstance(struct, dict):
        inputs = sorted(struct)
        return DictFeed(list(zip(sorted(keys), inputs, [struct[n] for n in inputs])), missing)
    return DictFeed([(name, name, tensor) for name, tensor in zip(names, tensors)], missing)


# Input forms -------------------------------------------------------------------
#
# Generators and `keras.utils.PyDataset` are read through Keras's own data
# adapters, so that their batches, steps, workers, queue and epoch hooks are
# those of `model.fit`.

try:  # keras/src/trainers/data_adapters/ (3.0-3.15)
    from keras.src.trainers.data_adapters.generator_data_adapter import GeneratorDataAdapter as _GeneratorAdapter
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter as _PyDatasetAdapter
except ImportError:  # pragma: no cover
    _GeneratorAdapter = _PyDatasetAdapter = None

# Grain's datasets (grain.MapDataset, grain.IterDataset, grain.DataLoader), which model.fit takes since Keras
# 3.10 and which a KerasHub task's own fit makes from arrays when grain is installed:
# keras/src/trainers/data_adapters/grain_dataset_adapter.py and `data_adapters.is_grain_dataset` (3.10-3.15).
try:
    from keras.src.trainers.data_adapters import is_grain_dataset as _is_grain_dataset
    from keras.src.trainers.data_adapters.grain_dataset_adapter import GrainDatasetAdapter as _GrainAdapter
except ImportError:  # Keras before 3.10: model.fit takes no grain dataset either
    _is_grain_dataset = _GrainAdapter = None


def is_grain_dataset(x: Any) -> bool:
    return _is_grain_dataset is not None and bool(_is_grain_dataset(x))


def keras_adapter(x: Any, *, class_weight: Any = None, shuffle: bool = False) -> Any:
    """Keras's adapter for a generator, PyDataset or grain dataset: `.get_tf_dataset()`, `.num_batches`, epoch
    hooks."""
    if _GeneratorAdapter is None:  # pragma: no cover
        raise RuntimeError("This Keras has no keras.src.trainers.data_adapters; pass a tf.data.Dataset instead.")
    if isinstance(x, keras.utils.PyDataset):
        return _PyDatasetAdapter(x, class_weight=class_weight, shuffle=shuffle)
    if is_grain_dataset(x):
        return _GrainAdapter(x)
    return _GeneratorAdapter(x)


def adapter_warnings(x: Any, shuffle: bool) -> list:
    """The warnings model.fit's data adapters give for a tf.data.Dataset or PyDataset `x` (Keras's own
    `get_data_adapter`, keras/src/trainers/data_adapters/__init__.py: from some version after 3.8, that
    `shuffle` leaves them as they are). Their adapters only keep `x` when made; generators, whose adapter
    reads a batch, give none here."""
    if not isinstance(x, (tf.data.Dataset, keras.utils.PyDataset)):
        return []
    try:
        from keras.src.trainers.data_adapters import get_data_adapter
    except ImportError:  # pragma: no cover
        return []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            get_data_adapter(x, shuffle=shuffle)
        except Exception:  # noqa: BLE001 (what Keras refuses, the trainer's own checks say)
            return []
    return list(caught)


def first_batch(adapter: Any) -> Any:
    """The first batch an adapter yields, read without consuming anything (it was peeked or is indexed)."""
    if isinstance(adapter, _PyDatasetAdapter):
        return adapter._standardize_batch(adapter.py_dataset[0])
    if _GrainAdapter is not None and isinstance(adapter, _GrainAdapter):  # read again: grain's datasets replay
        return next(iter(adapter._dataset))
    return adapter._first_batches[0]


def declared_batch_size(dataset: tf.data.Dataset) -> tuple[bool, int | None]:
    """(batched, batch size) from the `.batch()` in `dataset`'s chain of transformations.

    Walks `_input_dataset` (tf.data's Python classes, TF 2.16-2.21) back from
    the dataset through maps, prefetches, caches and the like, to the last
    `.batch`, `.padded_batch` or `.unbatch`; (False, None) when the chain ends
    without one, or passes through something whose batching it cannot see.
    """
    while dataset is not None:
        name = type(dataset).__name__
        if "Unbatch" in name:
            return False, None
        if "Rebatch" in name:  # batched, to sizes this walk does not read
            return True, None
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            value = tf.get_static_value(size)
            return True, (int(value) if value is not None and int(value) > 0 else None)
        dataset = getattr(dataset, "_input_dataset", None)
    return False, None


@dataclasses.dataclass(frozen=True)
class KerasView:
    """What Keras's own data handling makes of a tf.data.Dataset, generator, PyDataset or grain dataset."""
    dataset: tf.data.Dataset  # the data as tf.data: the dataset itself, or its adapter's
    adapter: Any = None  # a Python-fed form's adapter: `.num_batches`, its epoch hooks
    first: Any = None  # that adapter's first batch, read without consuming anything
    batched: bool = False  # a tf.data.Dataset's: whether a `.batch()` made its elements
    batch_size: int | None = None  # that `.batch()`'s size, where static
    warnings: tuple = ()  # what model.fit's adapters warn about it, when asked for


def keras_view(x: Any, *, class_weight: Any = None, shuffle: bool = False, warn: bool = False) -> KerasView:
    """Reads `x` as model.fit's data adapters read it; raises their ValueError for data they refuse."""
    caught = tuple(adapter_warnings(x, shuffle)) if warn else ()
    if isinstance(x, tf.data.Dataset):
        batched, batch_size = declared_batch_size(x)
        return KerasView(x, batched=batched, batch_size=batch_size, warnings=caught)
    adapter = keras_adapter(x, class_weight=class_weight, shuffle=shuffle)
    return KerasView(adapter.get_tf_dataset(), adapter, first_batch(adapter), warnings=caught)


# Keras's own fit, evaluate and predict ---------------------------------------------
#
# `Trainer.fit(model, ...)` calls `model.fit(...)`, so that what a model's class
# overrides (a KerasHub task's preprocessing) and what a library patches onto
# `keras.Model.fit` (MLflow's autologging) still run; where that chain reaches
# Keras's backend method, the trainer's engine takes over (trainer/route.py).
# The backend methods are `TensorFlowTrainer.fit`, `evaluate` and `predict`
# (keras/src/backend/tensorflow/trainer.py, 3.8-3.15; with `train_on_batch` and its kin, which
# the route refuses), the first three wrapped by
# `traceback_utils.filter_traceback`, whose closure holds the method itself. A
# patch such as MLflow's keeps the wrapper it found, so the hook goes inside
# it: the closure's cell gets the dispatcher, and every holder of the wrapper
# reaches it. Where the wrapper is not there, the class attribute is replaced
# instead (a patch made before then keeps Keras's own method). Hooked only
# while a trainer call or `Trainer.distribute()` is under way, then put back.

try:
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer as _TFTrainer
except ImportError:  # pragma: no cover - no TensorFlow backend: nothing to route
    _TFTrainer = None

# fit, evaluate, predict, and the per-batch methods a model's own loop could call instead
KERAS_METHODS = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")
_hook_lock = threading.Lock()
_hook_users = 0
_unhook: list[Callable[[], None]] = []


def _hook_one(name: str, dispatch: Callable) -> Callable[[], None]:
    """Points Keras's backend method `name` at `dispatch(name, method, model, args, kwargs)`; returns the undo."""
    wrapper = _TFTrainer.__dict__[name]
    cells = [cell for cell in (getattr(wrapper, "__closure__", None) or ())
             if inspect.isfunction(cell.cell_contents) and cell.cell_contents.__name__ == name]

    def hooked_for(method):
        @functools.wraps(method)
        def hooked(self, *args, **kwargs):
            return dispatch(name, method, self, args, kwargs)
        return hooked

    if len(cells) == 1:
        cell, method = cells[0], cells[0].cell_contents
        cell.cell_contents = hooked_for(method)
        return lambda: setattr(cell, "cell_contents", method)
    setattr(_TFTrainer, name, hooked_for(wrapper))
    return lambda: setattr(_TFTrainer, name, wrapper)


@contextlib.contextmanager
def keras_methods_hooked(dispatch: Callable):
    """While inside (on any thread), Keras's own `fit`, `evaluate` and `predict` on the TensorFlow backend call
    `dispatch(name, keras_method, model, args, kwargs)` instead; nested and concurrent uses share one hook."""
    global _hook_users
    if _TFTrainer is None:  # pragma: no cover
        yield
        return
    with _hook_lock:
        if _hook_users == 0:
            _unhook[:] = [_hook_one(name, dispatch) for name in KERAS_METHODS]
        _hook_users += 1
    try:
        yield
    finally:
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0:
                while _unhook:
                    _unhook.pop()()


# TensorFlow internals ----------------------------------------------------------


@functools.cache  # TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it starts
def onednn_enabled() -> bool | None:
    """Whether TensorFlow's CPU kernels use oneDNN in this process (None if TF does not say).

    `tensorflow/python/util/_pywrap_util_port.IsMklEnabled` (2.5-2.21), which
    logs "oneDNN custom operations are on" at every call on TensorFlow 2.18:
    this probe's own notice is kept off the screen (`quiet`).
    """
    try:
        from tensorflow.python.util import _pywrap_util_port
    except ImportError:  # pragma: no cover
        return None
    is_enabled = getattr(_pywrap_util_port, "IsMklEnabled", None)
    if is_enabled is None:
        return None
    with startup_notices_hidden():
        return bool(is_enabled())


@contextlib.contextmanager
def collective_key_base(base: int):
    """MirroredStrategies made inside number their collective group keys from `base`.

    `MirroredStrategy._collective_key_base`, the class attribute TensorFlow's own
    tests set (2.4-2.21); a TensorFlow without it builds strategies as usual.
    """
    cls = tf.distribute.MirroredStrategy
    previous = getattr(cls, "_collective_key_base", 0)
    cls._collective_key_base = base
    try:
        yield
    finally:
        cls._collective_key_base = previous


def collective_group_keys(strategy: tf.distribute.Strategy) -> dict[int, str]:
    """Group key -> the devices it reduces over, for the keys a MirroredStrategy's collectives took so far.

    `extended._cross_device_ops` and `extended._collective_keys._known_groups`
    (2.4-2.21); empty where they are missing, or where the strategy reduces
    without collectives (ReductionToOneDevice).
    """
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return {}
    extended = strategy.extended
    if type(getattr(extended, "_cross_device_ops", None)).__name__ != "CollectiveAllReduce":
        return {}
    known = getattr(getattr(extended, "_collective_keys", None), "_known_groups", None) or {}
    return {key: devices for devices, key in known.items()}


try:  # tensorflow/python/distribute/collective_all_reduce_strategy.py (2.18-2.21, checked 2026-11-26)
    from tensorflow.python.distribute.collective_all_reduce_strategy import (
        CollectiveAllReduceExtended as _CollectiveExtended,
    )
except ImportError:  # pragma: no cover - then a CPU worker keeps TensorFlow's one replica
    _CollectiveExtended = None


def _own_cpu_count(worker_device: str) -> int:
    """The logical CPUs of the task `worker_device` names ("/job:worker/task:1"; "" for a process alone)."""
    here = tf.DeviceSpec.from_string(worker_device or "/job:localhost")
    specs = [tf.DeviceSpec.from_string(d.name) for d in tf.config.list_logical_devices("CPU")]
    return sum(1 for spec in specs if here.job in (spec.job, None) and here.task in (spec.task, None))


@contextlib.contextmanager
def worker_cpu_replicas():
    """MultiWorkerMirroredStrategies made inside give a worker without GPUs one replica per logical CPU of its own.

    `CollectiveAllReduceExtended._initialize_local_devices(cluster_resolver, worker_device)` -> (devices, kind)
    gives a CPU worker one device, whatever logical devices its process has, where MirroredStrategy gives one
    replica per logical CPU. With it, workers that each configure N logical CPUs (several GPUs per worker,
    simulated on CPU) run N replicas each. Like TensorFlow's GPU count, N must be the same on every worker.
    Once the worker's server runs, the logical devices listed are the whole cluster's: only this task's count.
    """
    original = getattr(_CollectiveExtended, "_initialize_local_devices", None)
    if original is None:  # pragma: no cover
        yield
        return

    def local_devices(self, cluster_resolver, worker_device):
        devices, kind = original(self, cluster_resolver, worker_device)
        count = _own_cpu_count(worker_device)
        if kind != "CPU" or count < 2:
            return devices, kind
        return tuple(f"{worker_device}/device:CPU:{i}" for i in range(count)), kind

    _CollectiveExtended._initialize_local_devices = local_devices
    try:
        yield
    finally:
        _CollectiveExtended._initialize_local_devices = original


# The coordination service's key-value store: `context.context().{coordination_service,
# set_config_key_value, get_config_key_value}` (tensorflow/python/eager/context.py, 2.18-2.21, checked
# 2026-11-26). MultiWorkerMirroredStrategy starts the service, led by the chief, on every worker; TensorFlow's
# PreemptionCheckpointHandler agrees on its save step through it, as BackupAndRestore does (`preemption.py`).


def cluster_store_running() -> bool:
    """Whether this process belongs to a cluster whose coordination service holds a key-value store."""
    from tensorflow.python.eager import context

    return getattr(context.context(), "coordination_service", None) is not None


def put_cluster_key(key: str, value: str) -> bool:
    """Sets `key` in the cluster's store; False if it was set already (by any task): keys are set once."""
    from tensorflow.python.eager import context

    try:
        context.context().set_config_key_value(key, value)
    except tf.errors.AlreadyExistsError:
        return False
    return True


def cluster_key(key: str, timeout_seconds: float) -> str | None:
    """`key`'s value in the cluster's store, waiting up to `timeout_seconds` for a task to set it; else None."""
    from tensorflow.python.eager import context

    try:
        return context.context().get_config_key_value(key, max(1, int(timeout_seconds * 1000)))
    except tf.errors.DeadlineExceededError:
        return None


def dataset_shuffles(dataset: tf.data.Dataset) -> list[tuple[bool, bool]]:
    """(reshuffles each time it is read, seeded) for each shuffle in `dataset`'s graph, functions included.

    `Dataset._as_serialized_graph` (2.0-2.21) and the Shuffle* ops' inputs
    (input, buffer_size, seed, seed2, ...): a shuffle is unseeded when both
    seeds are 0 (no op seed, no global seed when the dataset was made). A graph
    that cannot be read (a dataset of Python objects) gives no shuffles.
    """
    from tensorflow.core.framework import graph_pb2

    try:
        graph = graph_pb2.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    except Exception:  # noqa: BLE001 (TensorFlow raises various errors for graphs it will not serialize)
        return []
    found = []
    for nodes in [graph.node, *(function.node_def for function in graph.library.function)]:
        by_name = {node.name: node for node in nodes}

        def constant(name: str) -> int | None:
            node = by_name.get(name.split(":")[0].lstrip("^"))
            if node is None or node.op != "Const" or not node.attr["value"].tensor.int64_val:
                return None
            return node.attr["value"].tensor.int64_val[0]

        for node in nodes:
            if not node.op.startswith("Shuffle"):
                continue
            reshuffles = node.attr["reshuffle_each_iteration"].b if "reshuffle_each_iteration" in node.attr else True
            seeds = [constant(name) for name in node.input[2:4]]
            found.append((reshuffles, seeds != [0, 0]))
    return found


# A model's state, and the variables behind it ------------------------------------
#
# A Keras variable on the TensorFlow backend is a handle on a backing
# `tf.Variable`, its `_value` (keras/src/backend/tensorflow/core.py,
# `Variable._initialize`; 3.8-3.15), which is what step functions capture and
# what tf.distribute distributes. `trainer.placement` swaps it to move a model
# into a strategy's scope. Keras's TF optimizer remembers the strategy it was
# made under (`TFOptimizer._distribution_strategy`) and updates variables
# through it, and indexes its variables by the backing variable
# (`_var_key`, `_trainable_variables_indices`; 3.8-3.15).


def backing(variable: keras.Variable) -> Any:
    """The `tf.Variable` behind a Keras variable (None before it is initialized)."""
    return getattr(variable, "_value", None)


def set_backing(variable: keras.Variable, value: tf.Variable) -> None:
    variable._value = value


def optimizer_strategy(optimizer: Any) -> Any:
    """The strategy a Keras optimizer updates variables through (None for a non-TF optimizer)."""
    return getattr(optimizer, "_distribution_strategy", None)


def set_optimizer_strategy(optimizer: Any, strategy: tf.distribute.Strategy) -> None:
    if hasattr(optimizer, "_distribution_strategy"):
        optimizer._distribution_strategy = strategy


def schedule_of(optimizer: Any) -> Any:
    """The schedule object an optimizer was given (`learning_rate` reads its current value instead)."""
    return optimizer._learning_rate


def reindex(optimizer: Any) -> None:
    """Rebuilds the optimizer's index of its variables, which is keyed by their backing variables."""
    variables = getattr(optimizer, "_trainable_variables", None)
    index = getattr(optimizer, "_trainable_variables_indices", None)
    if variables is None or index is None or not getattr(optimizer, "built", False):
        return
    index.clear()
    for i, variable in enumerate(variables):
        index[optimizer._var_key(variable)] = i


def forget_traced_functions(model: keras.Model) -> None:
    """Drops the functions Keras's own fit, evaluate and predict traced: they captured the backing variables."""
    for layer in all_layers(model):
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(layer, name, None) is not None:
                setattr(layer, name, None)


def model_state(model: keras.Model) -> tuple[list, list]:
    """(every Keras variable the model holds, every optimizer it holds), each once, in a fixed order.

    The layers' weights and seed states, the metrics' variables (compiled ones,
    the loss tracker, a layer's own), and every optimizer's: `model.optimizer`
    and any other one that the model or one of its layers holds as an
    attribute, alone or in a list or dict (a GAN's two).
    """
    optimizers: list = []
    variables: dict[int, Any] = {}

    def add_optimizer(optimizer):
        if optimizer is not None and all(optimizer is not o for o in optimizers):
            optimizers.append(optimizer)
            add_optimizer(getattr(optimizer, "inner_optimizer", None))

    def add(values):
        for v in values:
            if isinstance(v, keras.Variable):
                variables.setdefault(id(v), v)

    add(model.variables)
    metrics = list(model.metrics)
    for layer in all_layers(model):
        metrics += list(getattr(layer, "_metrics", None) or [])  # tracked, even where `metrics` is overridden
    metrics += [m for m in (loss_tracker(model), compile_metrics(model)) if m is not None]
    metrics += list(getattr(compile_loss(model), "metrics", None) or [])
    for metric in metrics:
        add(metric.variables)
    add_optimizer(getattr(model, "optimizer", None))
    for layer in all_layers(model):
        for value in vars(layer).values():
            for item in _held(value):
                if isinstance(item, keras.optimizers.Optimizer):
                    add_optimizer(item)
    for optimizer in optimizers:
        add(optimizer.variables)
    return list(variables.values()), optimizers


def _held(value: Any) -> list:
    """What an attribute holds: the items of a list, tuple or dict, else the value itself."""
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, (list, tuple)) else [value]


def build_model_only(model: keras.Model, x: Any) -> None:
    """Creates the model's own variables from the shapes of `x`, symbolically (no op runs), as
    `Model._symbolic_build` does."""
    from keras.src import backend as _backend  # keras/src/backend (3.0-3.15): compute_output_spec

    def symbolic(t):
        return None if t is None else keras.KerasTensor(t.shape, keras.backend.standardize_dtype(t.dtype))

    _backend.compute_output_spec(model, keras.tree.map_structure(symbolic, x), training=False)
