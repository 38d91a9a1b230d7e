"""In-memory arrays fed straight into the step function, with no tf.data pipeline.

Each replica reads its slice of a global batch from the user's NumPy arrays
inside the fused step loop: one `tf.numpy_function` per replica per step
gathers the rows. There is no iterator to create or destroy, no copy of the
arrays into TensorFlow, and the global example count of every step is known
without a cross-replica sum. The slices are exactly those of
`arrays.array_dataset_fn` (which GPUs and TPUs still use): the global order
depends on the seed and the epoch only, and each replica, on any worker,
gathers its own contiguous share of each batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from trainer import strategy as strategy_lib
from trainer.arrays import OrderFn

if TYPE_CHECKING:
    from trainer.data import ArrayInput


def supports(strategy: tf.distribute.Strategy) -> bool:
    """Whether arrays should be fed this way: when the replicas are CPUs.

    On GPUs and TPUs the tf.data pipeline stays: it prefetches batches to the
    devices while they compute (and TPU replicas cannot run Python). Under
    parameter-server training, steps run on remote workers that hold no arrays.
    """
    return not (isinstance(strategy, tf.distribute.ParameterServerStrategy)
                or strategy_lib.runs_on_accelerators(strategy))


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
        self.num_examples = inp.num_examples
        self.global_batch_size = global_batch_size
        self.num_replicas = num_replicas
        self.steps_per_epoch = -(-inp.num_examples // global_batch_size)
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

    def replica_slice(self, step: int, replica: int) -> tuple[int, int, int]:
        """(start, size, global count) of `replica`'s share of `step`, in the epoch order.

        The global batch is cut into `num_replicas` contiguous slices whose sizes
        differ by at most one; the last batch of an epoch may be partial.
        """
        begin = step * self.global_batch_size
        count = min(self.global_batch_size, self.num_examples - begin)
        share, extra = divmod(count, self.num_replicas)
        start = begin + replica * share + min(replica, extra)
        return start, share + (replica < extra), count

    def gather(self, step, replica) -> list[np.ndarray]:
        """The replica's rows of every array, then the step's global example count (NumPy)."""
        start, size, count = self.replica_slice(int(step), int(replica))
        rows = self._rows[start : start + size]
        return [np.take(a, rows, axis=0) for a in self.leaves] + [np.float32(count)]


def replica_batch(current: Any, step: tf.Tensor, signature: tuple) -> tuple[Any, tf.Tensor]:
    """This replica's batch of `step` and the step's global example count (replica context).

    Args:
      current: a zero-argument callable returning the feed to read from when the
        step runs; the traced graph is reused across feeds with one signature.
      step: the global step within the epoch.
      signature: `ArrayFeed.signature` of every feed `current` may return.
    """
    structure, leaves = signature
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group

    def gather(step, replica):
        return current().gather(step, replica)

    dtypes = [tf.as_dtype(np.dtype(dtype)) for dtype, _ in leaves] + [tf.float32]
    # Stateless: a pure function of its inputs within one call, so nothing orders it after other ops.
    tensors = tf.numpy_function(gather, [step, replica], dtypes, stateful=False)
    for tensor, (_, shape) in zip(tensors, leaves):
        tensor.set_shape((None, *shape))
    tensors[-1].set_shape(())
    return tf.nest.pack_sequence_as(structure, tensors[:-1]), tensors[-1]
