"""Random draws inside a replica, as one device draws them for the whole global batch.

While a step is traced (`hooks`), a draw whose leading dimension is the replica's rows becomes that replica's
rows of the draw one device makes for the global batch (`Share.placed`: where its rows start). Any other draw
must stay as Keras makes it, the same on every replica, as on one device; one that follows the data but cannot
be mapped to one device's rows is named once (`names.warn_unsliced`). Why and how: docs/exactness.md,
"Random layers"; the cost: docs/performance.md, "One device's numbers on several replicas: what it costs".
"""

from __future__ import annotations

import contextlib
import numbers
import threading
from typing import Any, Callable

import keras
import tensorflow as tf

from trainer import _compat
from trainer.engine import draw_names as names
from trainer.engine import draw_shapes as shapes

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
    leading = shapes.leading(shape)
    rows = placed[1]
    if leading is None:
        return None
    if isinstance(leading, int):  # a static size follows the rows only where they are static too
        if isinstance(rows, int) and leading == rows:
            return True, placed, 1
        if isinstance(rows, int) and 0 < rows < leading and leading % rows == 0:
            if shapes.stacked_like(shape, leading // rows, rows):
                return True, placed, leading // rows
            if shapes.from_data(shape):
                names.warn_unsliced(leading, rows, names.user_line(), getattr(_local, "named", None))
        return None
    parts = shapes.stacked_parts(leading)
    in_blocks = None
    if parts is not None:  # a draw shaped like `tf.concat` of parts: exact where each part is the replica's rows
        in_blocks = shapes.all_of([shapes.equal(part, rows) for part in parts])
    leading = tf.cast(leading, rows.dtype) if tf.is_tensor(rows) else leading
    if shapes.from_data(shape) and not getattr(_local, "xla", False) and in_blocks is not True:
        # XLA compiles no Python: nothing is named there
        names.name_unsliced_when_run(leading, rows, getattr(_local, "named", None), unless=in_blocks)
    if in_blocks is not None and in_blocks is not False:
        return in_blocks, placed, len(parts)
    return tf.equal(leading, rows), placed, 1


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
        inner = shapes.inner_size(shape)
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
        block = shapes.with_leading(shape, rows)
        parts = []
        for j in range(blocks):
            start = first + j * examples
            parts.append(draw_rows(block, (start, rows, blocks * examples,
                                           tf.stack([tf.cast(start, tf.int64), tf.constant(0, tf.int64)]))))
        return tf.concat(parts, axis=0)

    return exact() if per_example is True else tf.cond(per_example, exact, keras_draw)


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
