"""Variables summed over replicas: a replica's update adds its own, as one device adds the whole batch's.

While a step is traced, Keras's `assign_add` and `assign_sub` of a variable made with `aggregation="sum"` hand
TensorFlow's own the update alone, which the strategy sums. Every other variable (on-read ones, such as Keras
3.10+'s metrics, and those averaged or taken from the first replica, where both ways agree) must keep Keras's.
Why: docs/exactness.md, "Variables a layer updates from its batch".
"""

from __future__ import annotations

import tensorflow as tf

from .shares import originals

try:  # keras/src/backend/common/variables.py (3.8-3.16): `assign_add` is `assign(self + value)`
    from keras.src.backend.common.stateless_scope import in_stateless_scope
    from keras.src.backend.common.variables import Variable as KerasVariable
except ImportError:  # pragma: no cover - `_compat.platform` names it before a call
    KerasVariable = None


def _sums_updates(variable) -> bool:
    """A variable summed over replicas and not kept per replica (a MirroredVariable, or the one copy
    CentralStorageStrategy's replicas share), updated inside a replica."""
    return (getattr(variable, "aggregation", None) == tf.VariableAggregation.SUM
            and variable.synchronization != tf.VariableSynchronization.ON_READ
            and tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()
            and not in_stateless_scope())


def summed_update(name: str):
    def update(self, value):
        backing = getattr(self, "_value", None)
        if not _sums_updates(backing):
            return originals[name](self, value)
        value = tf.cast(self._convert_to_tensor(value, dtype=self.dtype), backing.dtype)
        return getattr(backing, name)(tf.broadcast_to(value, self.shape))  # as `self + value` broadcasts

    return update
