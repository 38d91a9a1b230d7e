"""What a random draw's shape says of its rows: its leading size, static or read back from the ops that made
it, and whether it is shaped like a concatenation of parts (trainer/engine/draws.py maps such rows)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def leading(shape: Any) -> Any:
    """The leading dimension of a draw's shape: an int when static, else a scalar tensor (None: no dimension)."""
    if isinstance(shape, (tf.TensorShape, list, tuple)):
        if len(shape) == 0:
            return None
        first = shape[0]
        value = tf.get_static_value(first) if tf.is_tensor(first) else first
        return int(value) if value is not None else first
    static = tf.get_static_value(shape)
    if static is not None:
        return int(static[0]) if len(static) else None
    return tf.convert_to_tensor(shape)[0]


def stacked_parts(leading: tf.Tensor) -> list | None:
    """The leading sizes of the parts of the tensor whose leading size `leading` is, when it was made by
    `tf.concat` of two or more parts along its first axis (keras.io's GANs draw label noise shaped like their
    labels, the generated rows' then the real rows'); else None. `leading` is read back through the ops that
    take a size from a shape: `tf.shape(labels)[0]`, or `keras.ops.shape(labels)[0]`."""
    graph = tf.compat.v1.get_default_graph()
    if not hasattr(leading, "op") or leading.graph is not graph:
        return None
    op = leading.op
    if op.type != "StridedSlice" or tf.get_static_value(op.inputs[1]) is None:
        return None
    if list(tf.get_static_value(op.inputs[1])) != [0] or op.get_attr("shrink_axis_mask") != 1:
        return None
    shape_op = op.inputs[0].op
    if shape_op.type != "Shape":
        return None
    made = shape_op.inputs[0]
    while made.op.type == "Identity":
        made = made.op.inputs[0]
    if made.op.type != "ConcatV2" or made.graph is not graph or made.shape.rank is None:
        return None
    axis = tf.get_static_value(made.op.inputs[-1])
    if axis is None or int(axis) % max(made.shape.rank, 1) != 0 or len(made.op.inputs) < 3:
        return None
    return [part.shape[0] if part.shape.rank and part.shape[0] is not None else tf.shape(part)[0]
            for part in made.op.inputs[:-1]]


def stacked_like(shape: Any, parts: int, rows: int) -> bool:
    """Whether a draw of static `shape` is shaped like a tensor this step made by `tf.concat` of `parts` parts of
    `rows` rows along its first axis: static sizes leave no op to read back (`tf.shape` of a static tensor is a
    constant, `keras.ops.shape` gives numbers), so the step's own concatenations are looked up, newest first."""
    dims = static_dims(shape)
    if dims is None:
        return False
    for op in reversed(tf.compat.v1.get_default_graph().get_operations()):
        if op.type != "ConcatV2" or len(op.inputs) != parts + 1 or op.outputs[0].shape.as_list() != dims:
            continue
        axis = tf.get_static_value(op.inputs[-1])
        if axis is not None and int(axis) % len(dims) == 0 and all(
                part.shape.rank and part.shape[0] == rows for part in op.inputs[:-1]):
            return True
    return False


def static_dims(shape: Any) -> list[int] | None:
    """A draw's shape as a list of ints, or None where some size is known only when the step runs."""
    if isinstance(shape, tf.TensorShape):
        return shape.as_list() if shape.is_fully_defined() else None
    if isinstance(shape, (list, tuple)):
        dims = [tf.get_static_value(d) if tf.is_tensor(d) else d for d in shape]
        return [int(d) for d in dims] if dims and all(d is not None for d in dims) else None
    static = tf.get_static_value(shape)
    return [int(d) for d in static] if static is not None and len(static) else None


def equal(size: Any, rows: Any) -> Any:
    """size == rows: a bool where both are static, else a bool tensor."""
    if isinstance(size, int) and isinstance(rows, int):
        return size == rows
    if isinstance(size, int) or isinstance(rows, int):
        size, rows = (tf.convert_to_tensor(v) for v in (size, rows))
    return tf.equal(tf.cast(size, tf.int64), tf.cast(rows, tf.int64))


def all_of(conditions: list) -> Any:
    """Whether every condition holds: a bool where each is one, else a bool tensor."""
    if any(c is False for c in conditions):
        return False
    tensors = [c for c in conditions if c is not True]
    return True if not tensors else tf.reduce_all(tf.stack(tensors))


def from_data(shape: Any) -> bool:
    """Whether a draw's shape was computed from tensors (`tf.shape(labels)`), not written as numbers."""
    return tf.is_tensor(shape) or (isinstance(shape, (list, tuple)) and any(tf.is_tensor(d) for d in shape))


def with_leading(shape: Any, leading: Any) -> Any:
    """`shape` with its first size replaced by `leading`: a list where `shape` is one, else a tensor."""
    if isinstance(shape, (tf.TensorShape, list, tuple)):
        return [leading, *list(shape)[1:]]
    shape = tf.convert_to_tensor(shape)
    made = shape.op.inputs[0] if hasattr(shape, "op") and shape.op.type == "Shape" else None
    if made is not None and made.shape.rank is not None:  # tf.shape(x): x's static sizes where it has them
        return [leading, *[size if size is not None else shape[i + 1] for i, size in enumerate(made.shape[1:])]]
    return tf.concat([tf.reshape(tf.cast(leading, shape.dtype), [1]), shape[1:]], axis=0)


def inner_size(shape: Any) -> int | None:
    """The numbers per row of a draw whose other dimensions are static (None: some are not)."""
    if not isinstance(shape, (tf.TensorShape, list, tuple)):
        shape = tf.get_static_value(shape, partial=True)
        if shape is None:
            return None
    size = 1
    for dim in list(shape)[1:]:
        dim = tf.get_static_value(dim) if tf.is_tensor(dim) else dim
        if dim is None or dim < 0:
            return None
        size *= int(dim)
    return size
