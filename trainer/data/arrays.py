"""In-memory arrays -> each replica's slice of every global batch, epoch after epoch.

The global order of examples in an epoch depends on the seed and the epoch
only. Each global batch is cut into contiguous per-replica slices, and a worker
reads only its own replicas' slices. On CPU replicas the step function gathers
them itself (`trainer/data/feed.py`); on GPUs and TPUs this tf.data pipeline gathers
them from one host copy of the arrays and prefetches them to the devices.
"""

from __future__ import annotations

import mmap
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf


def epoch_order(num_examples: int, *, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The global order of examples in `epoch`: a function of seed and epoch only."""
    if not shuffle:
        return np.arange(num_examples)
    return np.random.default_rng([seed, epoch]).permutation(num_examples)


def replica_slices(
    num_examples: int, global_batch_size: int, num_replicas: int, start_step: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(start, size) of every replica's slice, step-major, into the epoch order: two [steps, replicas] arrays.

    Each global batch is split into `num_replicas` contiguous slices whose sizes
    differ by at most one (the last partial batch too), so concatenating the
    slices in replica order gives back the global batch.
    """
    begins = np.arange(start_step * global_batch_size, num_examples, global_batch_size, dtype=np.int64)
    counts = np.minimum(global_batch_size, num_examples - begins)
    sizes = counts[:, None] // num_replicas + (np.arange(num_replicas) < counts[:, None] % num_replicas)
    starts = begins[:, None] + np.cumsum(sizes, axis=1) - sizes
    return starts.reshape(-1, num_replicas), sizes.reshape(-1, num_replicas)


def computed_slices(num_examples: int, global_batch_size: int, num_replicas: int) -> tuple[np.ndarray, ...]:
    """What each replica computes on and counts in every step: four [steps, replicas] arrays.

    Returns (start, size) of the rows each replica computes on, into the epoch
    order; and (begin, end) of the rows it counts, within those. They are
    `arrays.replica_slices`, except that a step with fewer examples than
    replicas is computed whole by every replica (see trainer/data/feed.py).
    """
    starts, sizes = replica_slices(num_examples, global_batch_size, num_replicas)
    whole = sizes.sum(axis=1, keepdims=True) < num_replicas
    computed_starts = np.where(whole, starts[:, :1], starts)
    computed_sizes = np.where(whole, sizes.sum(axis=1, keepdims=True), sizes)
    tracked_begins = starts - computed_starts
    return computed_starts, computed_sizes, tracked_begins, tracked_begins + sizes


def computed_rows(size: int, replicas: range, num_replicas: int) -> tuple[int, int]:
    """[begin, end) of the rows of a global batch of `size` examples that `replicas` compute on, cut as
    `computed_slices` cuts it: the share of a worker whose replicas these are."""
    starts, sizes, _, _ = computed_slices(size, size, num_replicas)
    first, last = replicas[0], replicas[-1]
    return int(starts[0, first]), int(starts[0, last] + sizes[0, last])


OrderFn = Callable[[int], np.ndarray]  # epoch -> the global order of examples in that epoch


def uniform_rows(sizes: np.ndarray) -> int | None:
    """The rows of every replica's every step when they are all the same ([steps, replicas] sizes), else None:
    for arrays of N rows in global batches of B on R replicas, B / R when B divides N and R divides B."""
    return int(sizes.flat[0]) if sizes.size and (sizes == sizes.flat[0]).all() else None


def array_dataset_fn(
    host: Any, num_examples: int, order: OrderFn, global_batch_size: int, epochs: range, start_step: int = 0
) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
    """A per-worker dataset function that yields this worker's replicas' shares for `epochs`.

    `host` is the arrays' `host_copy`, `num_examples` their rows. Each element
    is (rows, global count, tracked [begin, end), placed (first row, examples)):
    the fields of the `feed.Share` that the replica computes on, cut as
    `computed_slices` cuts (all of a batch smaller than the replica count).

    Elements come step-major, one per local replica, which is the order in which
    tf.distribute hands successive elements of a per-worker dataset to its
    replicas. Each element is one gather from the arrays' host copy. The first
    epoch starts at `start_step`. One pass covers every epoch, so one iterator
    serves a whole fit (creating one per epoch costs ~0.1 s with several replicas).
    """
    def epoch_order(epoch):
        return order(int(epoch)).astype(np.int64)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        local = ctx.num_replicas_in_sync // ctx.num_input_pipelines
        mine = slice(ctx.input_pipeline_id * local, (ctx.input_pipeline_id + 1) * local)
        starts, sizes, begins, ends = computed_slices(num_examples, global_batch_size, ctx.num_replicas_in_sync)
        uniform = uniform_rows(sizes)  # a static batch size, as the feed gives it (`feed.step_batch`)
        global_counts = np.broadcast_to(sizes.sum(axis=1, keepdims=True), sizes.shape).astype(np.float32)
        placed = np.stack([starts - starts[:, :1],
                           np.broadcast_to((ends - begins).sum(axis=1, keepdims=True), sizes.shape)], axis=-1)
        slices = tf.data.Dataset.from_tensor_slices(tuple(
            a[:, mine].reshape(-1, *a.shape[2:]) for a in (starts, sizes, global_counts, np.stack([begins, ends], -1),
                                                           placed)))

        def one_epoch(epoch):
            rows_in_order = tf.numpy_function(epoch_order, [epoch], tf.int64, stateful=False)
            rows_in_order.set_shape([num_examples])

            def gather(start, size, global_count, tracked, where):
                rows = rows_in_order[start : start + size]
                if uniform is not None:
                    rows = tf.ensure_shape(rows, [uniform])
                # tf.data would stack a list of inputs into one tensor: a tuple, as Keras's own arrays give one
                return keras.tree.lists_to_tuples(tf.nest.map_structure(lambda v: _take(v, rows), host)), \
                    global_count, tracked, where

            skip = tf.where(epoch == epochs.start, tf.constant(start_step * local, tf.int64), 0)
            # A serial map measured faster than a parallel one here (bench/throughput.py):
            # each call is one large gather, already multi-threaded inside TensorFlow.
            return slices.skip(skip).map(gather)

        return tf.data.Dataset.range(epochs.start, epochs.stop).flat_map(one_epoch).prefetch(tf.data.AUTOTUNE)

    return dataset_fn


_CHUNK_BYTES = 8 * 2**20


def host_copy(arrays: Any) -> Any:
    """The arrays as host variables, filled chunk by chunk; a mapped file (`is_mapped`) stays where it is.

    A dataset that reads variables holds their handles only. Arrays captured as
    tensors would sit in the dataset graph as constants, which tf.data copies
    whenever it rewrites that graph (three copies in all on the first epoch);
    this way the arrays are copied once. A copy of a mapped file would read all
    of it on every worker: its rows are taken from the file as they are needed
    (`_take`), so a worker reads only its replicas' rows.
    """
    # Inside a user's strategy scope a variable would be replicated: use tensors there.
    fill = tf.constant if tf.distribute.has_strategy() else _fill_variable
    return tf.nest.map_structure(lambda a: a if a is None or is_mapped(a) else fill(a), arrays)


def _take(host: Any, rows: tf.Tensor) -> tf.Tensor:
    """`rows` of a host copy: gathered from the variable, or read from a mapped file (None stays)."""
    if host is None:
        return None
    if not isinstance(host, np.ndarray):
        return tf.gather(host, rows)
    taken = tf.numpy_function(lambda r: take(host, r), [rows], tf.as_dtype(fed_dtype(host)), stateful=False)
    return tf.ensure_shape(taken, rows.shape[:1].concatenate(host.shape[1:]))


def _fill_variable(array: np.ndarray) -> tf.Variable:
    with tf.device("/cpu:0"):
        variable = tf.Variable(tf.zeros(array.shape, array.dtype), trainable=False)
    rows = max(1, _CHUNK_BYTES // max(1, array[:1].nbytes))
    for begin in range(0, len(array), rows):
        # A scatter writes in place; a slice assign would copy the whole variable first.
        end = min(begin + rows, len(array))
        variable.scatter_update(tf.IndexedSlices(array[begin:end], tf.range(begin, end)))
    return variable


def row_slice(t: Any, begin: tf.Tensor, end: tf.Tensor) -> Any:
    """Rows `begin` to `end` of a tensor: dense, ragged or sparse (None, an optional input's absence, stays)."""
    if t is None:
        return None
    if isinstance(t, tf.SparseTensor):
        begin, end, rest = tf.cast(begin, tf.int64), tf.cast(end, tf.int64), t.dense_shape[1:]
        return tf.sparse.slice(t, tf.concat([[begin], tf.zeros_like(rest)], 0), tf.concat([[end - begin], rest], 0))
    return t[begin:end]


def as_float32(value: Any) -> Any:
    """A float64 NumPy array as float32, anything else as it is: float64 would double memory and be cast by every
    layer anyway. A mapped file keeps its float64 rows until they are taken (`take`), so that each worker reads
    its own rows only."""
    return value.astype(np.float32) if isinstance(value, np.ndarray) and value.dtype == np.float64 else value


def fed_dtype(array: np.ndarray) -> np.dtype:
    """The dtype of the rows `take` gives of `array`."""
    return np.dtype(np.float32) if array.dtype == np.float64 else array.dtype


def take(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """`rows` of an array, as the steps are fed them (`fed_dtype`)."""
    return as_float32(np.take(array, rows, axis=0))


def is_mapped(array: Any) -> bool:
    """Whether a NumPy array's memory is a mapped file (an np.memmap, or a view of one): its pages are read from
    the file as they are touched, so a pass over all of it reads the whole file."""
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, mmap.mmap)


def num_rows(array: Any) -> int:
    """Rows of an array, ragged or sparse tensor; -1 for a scalar."""
    if isinstance(array, tf.RaggedTensor):
        return int(array.nrows())
    if isinstance(array, tf.SparseTensor):
        return int(array.dense_shape[0]) if array.shape.rank else -1
    return len(array) if array.ndim else -1


def gather_rows(t: Any, rows: tf.Tensor) -> Any:
    """The rows `rows` (distinct) of a tensor, in that order: dense, ragged or sparse (None stays)."""
    if t is None:
        return None
    if not isinstance(t, tf.SparseTensor):
        return tf.gather(t, rows)
    # Each entry's row moves to the row's position in `rows`; entries of rows not asked for are dropped.
    position = tf.tensor_scatter_nd_update(tf.fill([t.dense_shape[0]], tf.constant(-1, tf.int64)), rows[:, None],
                                           tf.range(tf.size(rows, tf.int64)))
    new_row = tf.gather(position, t.indices[:, 0])
    kept = new_row >= 0
    indices = tf.concat([new_row[kept][:, None], tf.boolean_mask(t.indices, kept)[:, 1:]], axis=1)
    shape = tf.concat([[tf.size(rows, tf.int64)], t.dense_shape[1:]], axis=0)
    return tf.sparse.reorder(tf.SparseTensor(indices, tf.boolean_mask(t.values, kept), shape))
