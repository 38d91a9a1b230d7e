"""A ParameterServerStrategy's partitioned variables (ShardedVariable), which Keras's tape and updates
cannot take.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from .variables import backing


try:  # tensorflow/python/distribute/{sharded_variable,parameter_server_strategy}.py (2.18-2.22): what a
    # ParameterServerStrategy's variable_partitioner makes, and the update path that cannot take it
    from tensorflow.python.distribute.parameter_server_strategy import (
        ParameterServerStrategyExtended as _PSExtended,
    )
    from tensorflow.python.distribute.sharded_variable import ShardedVariable as _ShardedVariable
except ImportError:  # pragma: no cover - then no variable is ever sharded
    _PSExtended = _ShardedVariable = None

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
