"""Random draws inside a replica, as one device draws them for the whole global batch.

Keras draws every random number of a layer or a train step with TensorFlow's
stateless ops, from seeds that its SeedGenerators hand out alike on every
replica (`_compat.keras_random_module`). Each replica runs the model on its own
rows, so a draw shaped like those rows would give every replica the first rows
of the draw one device makes: replica 1 would drop out the units replica 0
drops. While a step is traced (`hooks`), a draw whose leading dimension is the
replica's rows is replaced by *that replica's rows of the one-device draw for
the global batch* (`Share.placed`: where the rows start, and the examples):

- Philox, the stateless generator on CPUs and GPUs, is counter-based: number
  k of a draw comes from counter k // 4 (k // 2 for 64-bit values). Starting
  the counter at the replica's first number gives exactly its rows, for the
  cost of its own rows (`_own_rows`).
- A truncated normal samples by rejection, XLA lays a normal draw's numbers
  out by its shape (seen on TensorFlow 2.21), and another generator (a TPU's)
  may count otherwise: there the replica draws the whole global batch's
  numbers and keeps its rows (`_global_rows`), R times the numbers.

A draw shaped like a tensor the step made by `tf.concat` of parts that are
each the replica's rows (keras.io's GANs draw label noise over the generated
rows and the real rows together) takes, part by part, the replica's rows of
each part of one device's draw (`_in_blocks`). The parts are read back from the
draw's size (`tf.shape(labels)[0]`), or, where all sizes are static and no op
is left to read, found among the step's concatenations (`_stacked_like`).

Any other draw whose leading dimension is not the replica's rows (a weight's
noise, a draw of one number per step) is not per example: it stays as Keras
makes it, the same on every replica, as on one device. A dimension is taken as
the rows when it is dynamic and equals the rows when the step runs, or when
both are static and equal. A draw that follows the data but is none of these is
named once (`_warn_unsliced`), and recorded in the `named` dict of the steps
that traced it, for the plan of the model's next fit.
"""

from __future__ import annotations

import contextlib
import numbers
import os
import sys
import threading
import warnings
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from trainer import _compat
from trainer.user_line import user_stacklevel

_local = threading.local()  # .placed: (first row, rows, examples, first row's counter) of the replica traced;
# .named: the traced steps' record of the draws named
_originals: dict[str, Callable] = {}  # Keras's random functions, while `hooks` has them replaced


@contextlib.contextmanager
def replica_rows(batch: Any, placed: tuple[tf.Tensor, tf.Tensor] | None, *, xla: bool = False,
                 named: dict | None = None):
    """While a replica's step is traced: its rows `batch` sit at `placed` = (first row, examples) of the global
    batch (None: unknown, and draws stay Keras's). `xla`: the draws are compiled by XLA, whose normal
    distribution lays a draw's numbers out by its shape, so only its uniform draws follow the counter.
    `named`: the steps' record of the draws that are not one device's, {(file, line): description}, filled
    when such a draw is traced or, where its sizes are known only then, when it runs."""
    previous = getattr(_local, "placed", None), getattr(_local, "xla", False), getattr(_local, "named", None)
    context = tf.distribute.get_replica_context()
    if placed is None or context is None or context.num_replicas_in_sync == 1:  # one replica draws as Keras
        _local.placed = None
    else:
        leaf = next(t for t in tf.nest.flatten(batch) if t is not None)  # None: an optional input's absence
        rows = leaf.shape[0] if leaf.shape.rank and leaf.shape[0] is not None else tf.shape(leaf)[0]
        # Philox's counter for the replica's first row, per counter a row takes (low word; see `_skipped`)
        first_row = tf.stack([tf.cast(placed[0], tf.int64), tf.constant(0, tf.int64)])
        _local.placed = (placed[0], rows, placed[1], first_row)
    _local.xla, _local.named = xla, named
    try:
        yield
    finally:
        _local.placed, _local.xla, _local.named = previous


@contextlib.contextmanager
def hooks():
    """While step functions are traced: Keras's random functions draw the replica's rows of one device's draw."""
    with _PATCHES.installed():
        yield


def _rows_of(shape: Any) -> tuple[Any, tuple, int] | None:
    """(whether the draw is per example, as a bool or a bool tensor; the replica's placement; how many blocks of
    the replica's rows it holds), or None when it is not per example, or when no replica is being traced."""
    placed = getattr(_local, "placed", None)
    if placed is None:
        return None
    leading = _leading(shape)
    rows = placed[1]
    if leading is None:
        return None
    if isinstance(leading, int):  # a static size follows the rows only where they are static too
        if isinstance(rows, int) and leading == rows:
            return True, placed, 1
        if isinstance(rows, int) and 0 < rows < leading and leading % rows == 0:
            if _stacked_like(shape, leading // rows, rows):
                return True, placed, leading // rows
            if _from_data(shape):
                _warn_unsliced(leading, rows, _user_line(), getattr(_local, "named", None))
        return None
    parts = _stacked_parts(leading)
    in_blocks = None
    if parts is not None:  # a draw shaped like `tf.concat` of parts: exact where each part is the replica's rows
        in_blocks = _all([_equal(part, rows) for part in parts])
    leading = tf.cast(leading, rows.dtype) if tf.is_tensor(rows) else leading
    if _from_data(shape) and not getattr(_local, "xla", False) and in_blocks is not True:
        _name_unsliced_when_run(leading, rows, unless=in_blocks)  # XLA compiles no Python: nothing named there
    if in_blocks is not None and in_blocks is not False:
        return in_blocks, placed, len(parts)
    return tf.equal(leading, rows), placed, 1


def _stacked_parts(leading: tf.Tensor) -> list | None:
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


def _stacked_like(shape: Any, parts: int, rows: int) -> bool:
    """Whether a draw of static `shape` is shaped like a tensor this step made by `tf.concat` of `parts` parts of
    `rows` rows along its first axis: static sizes leave no op to read back (`tf.shape` of a static tensor is a
    constant, `keras.ops.shape` gives numbers), so the step's own concatenations are looked up, newest first."""
    dims = _static_dims(shape)
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


def _static_dims(shape: Any) -> list[int] | None:
    """A draw's shape as a list of ints, or None where some size is known only when the step runs."""
    if isinstance(shape, tf.TensorShape):
        return shape.as_list() if shape.is_fully_defined() else None
    if isinstance(shape, (list, tuple)):
        dims = [tf.get_static_value(d) if tf.is_tensor(d) else d for d in shape]
        return [int(d) for d in dims] if dims and all(d is not None for d in dims) else None
    static = tf.get_static_value(shape)
    return [int(d) for d in static] if static is not None and len(static) else None


def _equal(size: Any, rows: Any) -> Any:
    """size == rows: a bool where both are static, else a bool tensor."""
    if isinstance(size, int) and isinstance(rows, int):
        return size == rows
    if isinstance(size, int) or isinstance(rows, int):
        size, rows = (tf.convert_to_tensor(v) for v in (size, rows))
    return tf.equal(tf.cast(size, tf.int64), tf.cast(rows, tf.int64))


def _all(conditions: list) -> Any:
    """Whether every condition holds: a bool where each is one, else a bool tensor."""
    if any(c is False for c in conditions):
        return False
    tensors = [c for c in conditions if c is not True]
    return True if not tensors else tf.reduce_all(tf.stack(tensors))


def _from_data(shape: Any) -> bool:
    """Whether a draw's shape was computed from tensors (`tf.shape(labels)`), not written as numbers."""
    return tf.is_tensor(shape) or (isinstance(shape, (list, tuple)) and any(tf.is_tensor(d) for d in shape))


class _Unsliced(UserWarning):
    pass


def _warn_unsliced(leading: int, rows: int, where: tuple, named: dict | None) -> None:
    """Names a draw that follows the data but not the replica's rows (keras.io's GANs draw label noise over the
    generated and the real rows together): each replica draws numbers of its own, not its rows of one
    device's draw, so the step's numbers are not one device's. `where`: (file, line, module) of the draw;
    `named`: the steps' record (`replica_rows`), which gets the draw for the plan, and names each draw once
    however the user's filters show warnings."""
    if named is not None:
        if where[:2] in named:
            return
        named[where[:2]] = f"{os.path.basename(where[0])}:{where[1]} draws {leading} rows where a replica has {rows}"
    text = (
        f"A random draw in the step has {leading} rows, computed from the data, where the replica's batch has "
        f"{rows}: the trainer gives a replica its rows of one device's draw only for a draw over its own rows, so "
        f"each replica draws this one on its own, and the numbers differ from one device's. Draw per example "
        f"instead (a draw over each batch-sized part, e.g. keras.random.uniform((batch_size, 1)) for the "
        f"generated and for the real rows, then concatenated) to have one device's numbers.")
    warnings.warn_explicit(text, _Unsliced, where[0], where[1], module=where[2])


def _user_line() -> tuple:
    """(file, line, module) of the user's code that made the draw being traced."""
    frame = sys._getframe(user_stacklevel() - 1)  # a stacklevel counts its caller as 1
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals.get("__name__", "")


def _name_unsliced_when_run(leading: tf.Tensor, rows: Any, unless: Any = None) -> None:
    """`_warn_unsliced` from the step, for a draw whose sizes are known only when it runs: a branch that runs
    only for such a draw (a scalar comparison a step otherwise), pointing at the line found now. `unless`: a
    bool tensor that holds where the draw is exact after all (its parts are the replica's rows)."""
    where, named = _user_line(), getattr(_local, "named", None)

    def warn(leading, rows):
        _warn_unsliced(int(leading), int(rows), where, named)
        return np.int32(0)

    rows = tf.cast(rows, leading.dtype)
    unsliced = tf.logical_and(leading > rows, tf.equal(leading % tf.maximum(rows, 1), 0))
    if unless is not None:
        unsliced = tf.logical_and(unsliced, tf.logical_not(unless))
    tf.cond(unsliced, lambda: tf.numpy_function(warn, [leading, rows], tf.int32, stateful=True),
            lambda: tf.constant(0, tf.int32))


def _leading(shape: Any) -> Any:
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


def _draw(raw: Callable, shape: Any, seed: tf.Tensor, rows_of: tuple, per_counter: int,
          counted: bool = True) -> tf.Tensor:
    """`raw(shape, key, counter, alg)`'s numbers for `shape`, each replica taking its rows of the global draw
    (from Philox's counter where `counted`, else from the whole global draw).

    The counter's way has no branch: a draw that turns out not to be per example starts at the counter's own
    start, which is Keras's draw.
    """
    per_example, (first, rows, examples, first_row), blocks = rows_of
    key, counter, alg = tf.raw_ops.StatelessRandomGetKeyCounterAlg(seed=seed)
    if blocks > 1:
        return _in_blocks(lambda block, placed: _draw(raw, block, seed, (True, placed, 1), per_counter, counted),
                          shape, rows_of, lambda: raw(tf.convert_to_tensor(shape), key, counter, alg))
    if counted and _philox():
        inner = _inner_size(shape)
        if inner is not None and inner % per_counter == 0:  # the replica's rows start at a counter of their own
            return raw(shape, key, _skipped(counter, first_row * (inner // per_counter), per_example), alg)
        shape = tf.cast(tf.convert_to_tensor(shape), tf.int64)
        return _own_rows(raw, shape, key, counter, alg, first * tf.reduce_prod(shape[1:]), per_example,
                         per_counter)
    shape = tf.cast(tf.convert_to_tensor(shape), tf.int64)
    whole = lambda: _global_rows(raw, shape, key, counter, alg, first, rows, examples)  # noqa: E731
    if per_example is True:
        return whole()
    return tf.cond(per_example, whole, lambda: raw(shape, key, counter, alg))


def _philox() -> bool:
    """Whether stateless draws here come from Philox's counter: on CPUs and GPUs (a TPU's generator counts
    otherwise)."""
    return not tf.config.list_logical_devices("TPU")


def _in_blocks(draw_rows: Callable, shape: Any, rows_of: tuple, keras_draw: Callable) -> tf.Tensor:
    """A draw shaped like `tf.concat` of `blocks` parts, each the replica's rows: block j is the replica's rows
    of part j of one device's draw, which starts at row j * examples (one device's parts hold every example).
    `draw_rows(block_shape, placed)` draws one block's rows at `placed`; `keras_draw()`, Keras's own draw,
    serves where the parts turn out not to be the replica's rows."""
    per_example, (first, rows, examples, _), blocks = rows_of

    def exact():
        block = _with_leading(shape, rows)
        parts = []
        for j in range(blocks):
            start = first + j * examples
            parts.append(draw_rows(block, (start, rows, blocks * examples,
                                           tf.stack([tf.cast(start, tf.int64), tf.constant(0, tf.int64)]))))
        return tf.concat(parts, axis=0)

    return exact() if per_example is True else tf.cond(per_example, exact, keras_draw)


def _with_leading(shape: Any, leading: Any) -> Any:
    """`shape` with its first size replaced by `leading`: a list where `shape` is one, else a tensor."""
    if isinstance(shape, (tf.TensorShape, list, tuple)):
        return [leading, *list(shape)[1:]]
    shape = tf.convert_to_tensor(shape)
    made = shape.op.inputs[0] if hasattr(shape, "op") and shape.op.type == "Shape" else None
    if made is not None and made.shape.rank is not None:  # tf.shape(x): x's static sizes where it has them
        return [leading, *[size if size is not None else shape[i + 1] for i, size in enumerate(made.shape[1:])]]
    return tf.concat([tf.reshape(tf.cast(leading, shape.dtype), [1]), shape[1:]], axis=0)


def _inner_size(shape: Any) -> int | None:
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


def _skipped(counter: tf.Tensor, skip: tf.Tensor, per_example: Any) -> tf.Tensor:
    """Philox's 128-bit counter advanced by `skip`, int64[2] (low word, high word), or not advanced where the
    draw is not per example.

    TensorFlow derives the counter from the seed with a low word of 0 (seen on 2,000 seeds, TensorFlow 2.18
    and 2.21), so a skip below 2**64 never carries into the high word."""
    if per_example is not True:
        skip = tf.where(per_example, skip, tf.zeros_like(skip))
    return counter + tf.cast(skip, tf.uint64)


def _own_rows(raw, shape, key, counter, alg, start, per_example, per_counter: int) -> tf.Tensor:
    """The draw's numbers from number `start` of the global draw on, where a row's numbers do not fill whole
    counters: the draw starts at the counter before `start` and drops the numbers ahead of it."""
    if per_example is not True:
        start = tf.where(per_example, start, tf.zeros_like(start))
    lead = start % per_counter
    skip = tf.stack([start // per_counter, tf.constant(0, tf.int64)])
    flat = raw(tf.reshape(lead + tf.reduce_prod(shape), [1]), key, _skipped(counter, skip, True), alg)[lead:]
    return tf.reshape(flat, shape)


def _global_rows(raw, shape, key, counter, alg, first, rows, examples) -> tf.Tensor:
    whole = raw(tf.concat([tf.reshape(examples, [1]), shape[1:]], axis=0), key, counter, alg)
    return whole[first:first + tf.cast(rows, tf.int64)]


def _per_counter(dtype: tf.DType) -> int:
    return 2 if dtype.size == 8 else 4


def _uniform_op(dtype):
    return lambda shape, key, counter, alg: tf.raw_ops.StatelessRandomUniformV2(
        shape=shape, key=key, counter=counter, alg=alg, dtype=dtype)


# Keras's functions, drawing the replica's rows (same arguments; each as tf.random's stateless ops compute).


def _normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    rows_of = _rows_of(shape)
    if rows_of is None:
        return _originals["normal"](shape, mean=mean, stddev=stddev, dtype=dtype, seed=seed)
    dtype = tf.as_dtype(dtype or keras.config.floatx())
    unit = _draw(lambda s, k, c, a: tf.raw_ops.StatelessRandomNormalV2(shape=s, key=k, counter=c, alg=a, dtype=dtype),
                 shape, _compat.keras_seed(seed), rows_of, _per_counter(dtype), counted=not _local.xla)
    return tf.add(unit * tf.convert_to_tensor(stddev, dtype), tf.convert_to_tensor(mean, dtype))


def _uniform(shape, minval=0.0, maxval=1.0, dtype=None, seed=None):
    rows_of = _rows_of(shape)
    if rows_of is None:
        return _originals["uniform"](shape, minval=minval, maxval=maxval, dtype=dtype, seed=seed)
    dtype = tf.as_dtype(dtype or keras.config.floatx())
    minval, maxval = tf.cast(minval, dtype), tf.cast(maxval, dtype)
    unit = _draw(_uniform_op(dtype), shape, _compat.keras_seed(seed), rows_of, _per_counter(dtype))
    return tf.add(unit * (maxval - minval), minval)


def _randint(shape, minval, maxval, dtype="int32", seed=None):
    rows_of = _rows_of(shape)
    if rows_of is None:
        return _originals["randint"](shape, minval, maxval, dtype=dtype, seed=seed)
    dtype = tf.as_dtype(dtype)
    drawn = dtype if dtype in (tf.int32, tf.int64) else tf.int64
    minval, maxval = tf.convert_to_tensor(minval, drawn), tf.convert_to_tensor(maxval, drawn)
    draws = _draw(lambda s, k, c, a: tf.raw_ops.StatelessRandomUniformIntV2(
        shape=s, key=k, counter=c, alg=a, minval=minval, maxval=maxval), shape, _compat.keras_seed(seed), rows_of,
        _per_counter(drawn))
    return tf.cast(draws, dtype)


def _truncated_normal(shape, mean=0.0, stddev=1.0, dtype=None, seed=None):
    rows_of = _rows_of(shape)
    if rows_of is None:
        return _originals["truncated_normal"](shape, mean=mean, stddev=stddev, dtype=dtype, seed=seed)
    dtype = tf.as_dtype(dtype or keras.config.floatx())
    seed = _compat.keras_seed(seed)

    def keras_draw(shape=shape):
        return tf.random.stateless_truncated_normal(shape, seed, mean=mean, stddev=stddev, dtype=dtype)

    def global_rows(shape, placed):  # rejection sampling counts no rows: the whole draw, then the replica's rows
        first, rows, examples, _ = placed
        whole = keras_draw(tf.concat([tf.reshape(examples, [1]), tf.cast(tf.convert_to_tensor(shape), tf.int64)[1:]],
                                     axis=0))
        return whole[first:first + tf.cast(rows, tf.int64)]

    per_example, placed, blocks = rows_of
    if blocks > 1:
        return _in_blocks(global_rows, shape, rows_of, keras_draw)
    if per_example is True:
        return global_rows(shape, placed)
    return tf.cond(per_example, lambda: global_rows(shape, placed), keras_draw)


def _dropout(inputs, rate, noise_shape=None, seed=None):
    if not isinstance(rate, numbers.Real) or not 0.0 < rate < 1.0:
        return _originals["dropout"](inputs, rate, noise_shape=noise_shape, seed=seed)
    x = tf.convert_to_tensor(inputs)
    shape = _compat.noise_shape(x, noise_shape)
    if tf.is_tensor(shape) and x.shape.rank is not None:  # the inputs' own shape: its static sizes where known
        shape = [shape[i] if size is None else size for i, size in enumerate(x.shape)]
    rows_of = _rows_of(shape)
    if rows_of is None:
        return _originals["dropout"](inputs, rate, noise_shape=noise_shape, seed=seed)
    # tf.nn.experimental.stateless_dropout's arithmetic: x * (1 / keep), zero where the uniform draw is < rate.
    kept = x * tf.convert_to_tensor(1 / (1 - rate), x.dtype)
    unit = _draw(_uniform_op(x.dtype), shape, _compat.keras_seed(seed), rows_of, _per_counter(x.dtype))
    return tf.where(unit >= tf.convert_to_tensor(rate, x.dtype), kept, tf.zeros([], x.dtype))


_REPLACEMENTS = {"normal": _normal, "uniform": _uniform, "randint": _randint, "truncated_normal": _truncated_normal,
                 "dropout": _dropout}
_KERAS_RANDOM = _compat.keras_random_module()
_PATCHES = _compat.Patches(
    "one device's random draws (dropout, noise, keras.random) on each replica's rows",
    [(name, _KERAS_RANDOM, name, _REPLACEMENTS.get(name), "keras/src/backend/tensorflow/random.py")
     for name in (*_compat.RANDOM_FUNCTIONS, "_cast_seed")], _originals)  # `_cast_seed` is only read
