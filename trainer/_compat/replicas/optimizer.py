"""Keras's optimizer in a replica of several: clipping, gradient accumulation and EMA act on the replicas'
summed gradient, as on one device.

- Keras clips (`clipnorm`, `clipvalue`, `global_clipnorm`) each replica's gradient, before the sum.
  `clip_gradients` sums them first, so the global gradient is clipped; the sum is then not taken again.
- Gradient accumulation and `ema_overwrite_frequency` update variables inside a `cond`, through
  `merge_call`, which a replica cannot do in a graph ("merge_call called while defining a new graph"), and
  the EMA update fails under CentralStorageStrategy. With those options `apply` sums the replicas' gradients
  and applies them once, in cross-replica context, where Keras's merge calls (`maybe_merge_call`) are plain
  calls.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from .collective import replicas, summed
from .shares import originals, share

try:  # keras/src/optimizers/base_optimizer.py (3.0-3.16): `apply` and `_clip_gradients`
    from keras.src.optimizers.base_optimizer import BaseOptimizer
except ImportError:  # pragma: no cover - `_compat.platform` names it before a call
    BaseOptimizer = None

# tensorflow/python/distribute/merge_call_interim.py (2.9-2.22), which Keras's TF optimizer calls as
# `tf.__internal__.distribute.interim.maybe_merge_call`.
interim = getattr(getattr(getattr(tf, "__internal__", None), "distribute", None), "interim", None)


def _clips(optimizer) -> bool:
    return any(getattr(optimizer, name, None) for name in ("clipnorm", "clipvalue", "global_clipnorm"))


def clip_gradients(self, grads):
    context = replicas()
    if context is not None and _clips(self):
        grads = summed(context, grads)
        share.summed = True
    return originals["clip"](self, grads)


def needs_one_apply(optimizer) -> bool:
    """Whether Keras's `apply` cannot run in a replica of several: gradient accumulation and
    EMA overwrite update inside a `cond`, and the EMA update writes a variable that
    CentralStorageStrategy aggregates."""
    return bool(getattr(optimizer, "gradient_accumulation_steps", None) or getattr(optimizer, "use_ema", False))


def apply(self, grads, trainable_variables=None):
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
        return originals["apply"](self, grads, trainable_variables)
    grads = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    sums = summed(context, grads)

    def apply_once(strategy, *present_grads):
        # The replicas hold the same sums; replica 0's are applied to every copy of each variable.
        full = [None] * len(grads)
        for i, g in zip(present, present_grads):
            full[i] = strategy.experimental_local_results(g)[0]
        with _merge_calls_inline():
            originals["apply"](self, full, trainable_variables)

    context.merge_call(apply_once, args=tuple(sums[i] for i in present))


def _maybe_merge_call(fn, strategy, *args, **kwargs):
    if tf.distribute.in_cross_replica_context():  # a merge call from cross-replica context is the call
        return fn(strategy, *args, **kwargs)
    return originals["merge_call"](fn, strategy, *args, **kwargs)


@contextlib.contextmanager
def _merge_calls_inline():
    interim.maybe_merge_call = _maybe_merge_call
    try:
        yield
    finally:
        interim.maybe_merge_call = originals["merge_call"]
