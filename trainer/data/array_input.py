"""In-memory arrays as an input kind (`ArrayInput`): their rows, shuffled each pass, and the reader that serves them.

How the rows are ordered and sliced per replica is `trainer/data/arrays.py`'s, and the reading the readers'
(`trainer/data/readers.py`): this kind picks between them for a strategy. It refuses nothing: the arrays
were checked where they came in (`trainer/data/user_arrays.py`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from trainer.data import arrays as arrays_lib
from trainer.data import feed
from trainer.data.input_kind import InputKind, worker_index
from trainer.data.readers import ArrayFeed, DistributedBatches, GlobalBatches

if TYPE_CHECKING:
    from trainer.data.inputs import Readers


@dataclasses.dataclass(frozen=True)
class ArrayInput(InputKind):
    """In-memory arrays: a nested structure with `num_examples` rows per leaf.

    The trainer shuffles them each pass from `seed`, cuts global batches, and
    splits each into contiguous per-replica slices; a worker reads only its
    own replicas' slices. The global order depends on the seed alone, and the
    last partial batch is kept.
    """

    arrays: Any
    num_examples: int
    form = "arrays"

    def signature(self) -> Any:
        parts = tuple(self.arrays) if isinstance(self.arrays, (tuple, list)) else (self.arrays,)  # as datasets'
        return tf.nest.map_structure(lambda a: None if a is None else tuple(a.shape[1:]), parts)

    def _sharding(self, num_workers: int) -> tuple[str, str]:
        reason = "the trainer splits each global batch into per-replica slices"
        if num_workers > 1:
            reason += f"; each worker gathers only its own (1/{num_workers} of the rows)"
        return "OFF", reason + "; one device's numbers"

    def sample(self, n: int) -> Any:
        """The first `n` examples, to build the model on."""
        def first(a):
            if a is None or _composite(a):
                return arrays_lib.row_slice(a, 0, n)
            return tf.convert_to_tensor(arrays_lib.as_float32(a[:n]))

        return tf.nest.map_structure(first, self.arrays)

    @property
    def reader_per_pass(self) -> bool:
        return self.composite

    @property
    def composite(self) -> bool:
        """Whether a leaf is a ragged or sparse tensor: a step can't gather it from a host copy, so a tf.data
        pipeline gathers its batches (`composite_batches`)."""
        return any(_composite(a) for a in tf.nest.flatten(self.arrays))

    def reader(self, readers: Readers, epoch: int | None = None, start_step: int = 0, until: int | None = None,
               place: Any = None):
        """Epochs `epoch` to `until` (one by default), each shuffled from the seed; without `epoch`, input order
        once (ragged or sparse arrays: one pass a reader). A `place` is not needed: the seed and the step say
        where the arrays are."""
        del place
        order = readers.order(self.num_examples, per_epoch=epoch is not None)
        if self.composite:
            batches = self.composite_batches(order(epoch or 0), readers.global_batch_size, start_step)
            if readers.in_step:
                return GlobalBatches(batches)
            return DistributedBatches(iter(readers.strategy.distribute_datasets_from_function(
                lambda context: feed.cut_shares(batches, context))), composite=True)
        epochs = range(1) if epoch is None else range(epoch, until or epoch + 1)
        if readers.in_step:
            return ArrayFeed(self.arrays, order, global_batch_size=readers.global_batch_size,
                                  num_replicas=readers.strategy.num_replicas_in_sync, epochs=epochs,
                                  start_step=start_step)
        fn = arrays_lib.array_dataset_fn(self.host(), self.num_examples, order, readers.global_batch_size, epochs,
                                         start_step)
        return DistributedBatches(iter(readers.strategy.distribute_datasets_from_function(
            lambda context: fn(context).map(feed.Cut.carrying))))

    def composite_batches(self, order: np.ndarray, global_batch_size: int, start_step: int) -> tf.data.Dataset:
        """The global batches of one pass in `order`, from step `start_step`: each gathered from the arrays, as
        Keras's array adapter gathers them (a mapped file whole: the tensors hold all of their arrays)."""
        arrays = tf.nest.map_structure(arrays_lib.as_float32, self.arrays)
        rows = tf.data.Dataset.from_tensor_slices(order.astype(np.int64)).batch(global_batch_size).skip(start_step)
        return rows.map(lambda r: tf.nest.map_structure(lambda a: arrays_lib.gather_rows(a, r), arrays)).prefetch(
            tf.data.AUTOTUNE)

    def host(self) -> Any:
        """The arrays as host variables, made once per input (`arrays.host_copy`)."""
        if "_host" not in self.__dict__:
            object.__setattr__(self, "_host", arrays_lib.host_copy(self.arrays))
        return self.__dict__["_host"]

    def per_worker_dataset(self, ctx: tf.distribute.InputContext, num_workers: int,
                           global_batch_size: int) -> tf.data.Dataset:
        # The arrays travel inside the dataset graph: fine for modest data; read files for more.
        ds = tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(arrays_lib.as_float32, self.arrays))
        ds = ds.shard(num_workers, worker_index())
        return ds.shuffle(-(-self.num_examples // num_workers)).repeat().batch(global_batch_size)


def _composite(array: Any) -> bool:
    """Whether `array` is a ragged or sparse tensor, which tf.data gathers (`ArrayInput.composite_batches`)."""
    return isinstance(array, (tf.RaggedTensor, tf.SparseTensor))
