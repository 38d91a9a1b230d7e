"""Inputs fed straight into the step function of CPU replicas.

Arrays need no tf.data pipeline. Each replica reads its slices of the global
batches from the user's NumPy arrays inside the step function: at the start of
a call, one `tf.numpy_function` per replica gathers its rows for all of the
call's steps (up to FETCH_BYTES), and each step slices its own out. One gather
per step instead cost ~0.5 ms per step on two CPU replicas, most of it in
TensorFlow's py-function call, not in the gather. There is no iterator to
create or destroy, no copy of the arrays into TensorFlow, and the global
example count of every step is known without a cross-replica sum. The slices
are exactly those of `arrays.array_dataset_fn` (which GPUs and TPUs still
use): the global order depends on the seed and the epoch only, and each
replica, on any worker, gathers its own contiguous share of each batch.

A tf.data dataset on one worker is read as whole global batches from one
plain host iterator, and each replica takes its share of every batch inside
the step (`replica_share`), cut the same way. TensorFlow's distributed
iterator would cost ~80 ms to set up each epoch under MirroredStrategy: its
MultiDeviceIterator traces 6 functions per device for every new iterator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from trainer import strategy as strategy_lib
from trainer.arrays import OrderFn, replica_slices

if TYPE_CHECKING:
    from trainer.data import ArrayInput


def supports(strategy: tf.distribute.Strategy) -> bool:
    """Whether inputs should be fed this way: when the replicas are CPUs.

    On GPUs and TPUs the tf.data pipeline stays: it prefetches batches to the
    devices while they compute (and TPU replicas cannot run Python). Under
    parameter-server training, steps run on remote workers that hold no arrays.
    """
    return not (isinstance(strategy, tf.distribute.ParameterServerStrategy)
                or strategy_lib.runs_on_accelerators(strategy))


FETCH_BYTES = 8 * 2**20  # rows gathered per step call, at most (unless one step needs more)


class ArrayFeed:
    """Serves global steps of `epochs` over in-memory arrays, a call's worth at a time.

    Args:
      inp: the arrays.
      order: epoch -> the global order of the examples in that epoch.
      global_batch_size: examples per global step.
      num_replicas: replicas in sync (over all workers).
      epochs: the epochs this feed covers, in order.
      start_step: global steps to skip in the first epoch (a resumed run).
    """

    def __init__(self, inp: ArrayInput, order: OrderFn, *, global_batch_size: int, num_replicas: int,
                 epochs: range = range(1), start_step: int = 0):
        self.leaves = tf.nest.flatten(inp.arrays)
        # [steps, replicas]: where each replica's slice of each step starts in the epoch order, and its size.
        self._starts, self._sizes = replica_slices(inp.num_examples, global_batch_size, num_replicas)
        self.steps_per_epoch = len(self._starts)
        step_bytes = global_batch_size * sum(a[:1].nbytes for a in self.leaves)
        self.steps_per_fetch = max(1, FETCH_BYTES // max(1, step_bytes))
        self._order_fn, self._epochs = order, iter(epochs)
        self._rows: np.ndarray | None = None
        self.step = start_step  # the next step of the current epoch
        # What the traced step loop depends on: structure, dtypes and per-example shapes.
        self.signature = (tf.nest.map_structure(lambda _: 0, inp.arrays),
                          tuple((a.dtype.str, a.shape[1:]) for a in self.leaves))

    def claim(self, num_steps: int) -> tuple[int, int]:
        """(first step, steps) for the next call: up to `num_steps` steps of the current epoch.

        Moves to the next epoch once the current one is done; (0, 0) when every
        epoch has been served.
        """
        if self._rows is None or self.step >= self.steps_per_epoch:
            epoch = next(self._epochs, None)
            if epoch is None:
                return 0, 0
            if self._rows is not None:
                self.step = 0
            self._rows = np.asarray(self._order_fn(epoch), np.int64)
        first = self.step
        count = max(0, min(num_steps, self.steps_per_epoch - first))
        self.step += count
        return first, count

    def fetches(self, num_steps: int) -> Iterator[tuple[int, int]]:
        """Claims up to `num_steps` steps and yields them as (first, count) pieces of at most `steps_per_fetch`."""
        first, count = self.claim(num_steps)
        for begin in range(first, first + count, self.steps_per_fetch):
            yield begin, min(self.steps_per_fetch, first + count - begin)

    def replica_rows(self, first: int, count: int, replica: int) -> list[np.ndarray]:
        """`replica`'s rows of steps first..first+count-1 of the current epoch (NumPy).

        Returns the rows of every array, concatenated step after step; then where
        each step's rows begin and end ([count + 1] bounds); then each step's
        global example count ([count]).
        """
        steps = slice(first, first + count)
        starts, sizes = self._starts[steps, replica], self._sizes[steps, replica]
        rows = np.concatenate([self._rows[s : s + n] for s, n in zip(starts, sizes)])
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        global_counts = self._sizes[steps].sum(axis=1).astype(np.float32)
        return [np.take(a, rows, axis=0) for a in self.leaves] + [bounds, global_counts]


Fetched = list  # the tensors of one `fetch`: rows of every array, step bounds, global counts


def fetch(current: Callable[[], ArrayFeed], first: tf.Tensor, count: tf.Tensor, signature: tuple) -> Fetched:
    """This replica's rows of steps first..first+count-1, in one gather (replica context).

    Args:
      current: returns the feed to read from when the step runs; the traced
        graph is reused across feeds with one signature.
      first, count: the steps, within the current epoch.
      signature: `ArrayFeed.signature` of every feed `current` may return.
    """
    _, leaves = signature
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group

    def gather(first, count, replica):
        return current().replica_rows(int(first), int(count), int(replica))

    dtypes = [tf.as_dtype(np.dtype(dtype)) for dtype, _ in leaves] + [tf.int64, tf.float32]
    # Stateless: a pure function of its inputs within one call, so nothing orders it after other ops.
    tensors = tf.numpy_function(gather, [first, count, replica], dtypes, stateful=False)
    for tensor, (_, shape) in zip(tensors, leaves):
        tensor.set_shape((None, *shape))
    tensors[-2].set_shape((None,))
    tensors[-1].set_shape((None,))
    return tensors


def step_batch(fetched: Fetched, i: tf.Tensor, signature: tuple) -> tuple[Any, tf.Tensor]:
    """Step `i` of a fetch: this replica's batch, and the step's global example count (replica context)."""
    structure, _ = signature
    *rows, bounds, global_counts = fetched
    begin, end = bounds[i], bounds[i + 1]
    return tf.nest.pack_sequence_as(structure, [r[begin:end] for r in rows]), global_counts[i]


def replica_share(batch: Any) -> tuple[Any, tf.Tensor]:
    """This replica's contiguous share of a whole global batch, and the batch's size (replica context).

    The shares are cut as `arrays.replica_slices` cuts them: sizes differ by at
    most one, the first replicas taking the extra examples. Replicas on CPUs
    share the host's memory, so each reads its rows of the one batch in place.
    """
    context = tf.distribute.get_replica_context()
    replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
    size = tf.shape(tf.nest.flatten(batch)[0])[0]
    base, extra = size // context.num_replicas_in_sync, size % context.num_replicas_in_sync
    begin = replica * base + tf.minimum(replica, extra)
    end = begin + base + tf.cast(replica < extra, tf.int32)
    return tf.nest.map_structure(lambda t: t[begin:end], batch), tf.cast(size, tf.float32)
