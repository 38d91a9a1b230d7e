"""The input kinds read as a pipeline per worker or replica, not cut from global batches: a dataset function
(`FunctionInput`, which shards and batches itself) and a dataset read by file shards (`FileShardsInput`,
`Trainer(data_sharding="files")`).

TensorFlow's distributed iterator hands each replica its batches, so these kinds never go to the readers
that split a global batch in the step; a resumed run starts their pipelines again instead of skipping into them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable

import tensorflow as tf

from trainer import _compat
from trainer.data.dataset_inputs import BatchedInput, DatasetInput
from trainer.data import marks
from trainer.data.input_kind import InputKind, Resumption
from trainer.data.readers import DistributedBatches
from trainer.distribute.cluster import strategy_cluster_info

if TYPE_CHECKING:
    from trainer.data.inputs import Readers


DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]


@dataclasses.dataclass(frozen=True)
class FunctionInput(InputKind):
    """A function `input_context -> tf.data.Dataset` (per-worker pipelines); it shards and batches itself.

    `options` are the `tf.distribute.InputOptions` of a dataset the user
    distributed from the function (None: TensorFlow's defaults), and
    `distributed` that dataset, which is read as it is.

    The function is called once for the distributed dataset that every epoch
    reads (not at all when the user distributed it), and once more for a
    dataset of this strategy's input context, read apart from it, that tells
    the batch (and gives a batch to build the model on, and whether the
    length is known).
    """

    fn: DatasetFn
    options: Any = dataclasses.field(default=None, compare=False)
    distributed: Any = dataclasses.field(default=None, compare=False, repr=False)
    form = "dataset function"
    num_examples = None

    def _sharding(self, num_workers: int) -> tuple[str, str]:
        return "per worker", "your dataset function shards by its input_context"

    def sample(self, n: int) -> Any:
        return next(iter(self._probe()))

    @property
    def unknown_to_keras(self) -> bool:
        """Whether model.fit, reading the function's dataset on one device, can't tell a pass's length (whose
        length is known or not alike for every input context)."""
        return int(self._probe().cardinality()) < 0

    def global_batch_size(self, strategy: tf.distribute.Strategy) -> int:
        """The global batch the steps run: a replica's batch, as the function makes it for this strategy's
        input context (its element spec's leading dimension, else its first batch's rows), times the replicas."""
        self._read_by(strategy)  # made first, as the user's own call would make it
        replicas = strategy.num_replicas_in_sync
        pipelines = strategy_cluster_info(strategy).num_workers
        per_replica_mode = (self.options is not None and self.options.experimental_replication_mode
                            == tf.distribute.InputReplicationMode.PER_REPLICA)
        context = tf.distribute.InputContext(num_input_pipelines=replicas if per_replica_mode else pipelines,
                                             input_pipeline_id=0, num_replicas_in_sync=replicas)
        dataset = self._made(("context", id(strategy)), lambda: self.fn(context))
        leaves = tf.nest.flatten(dataset.element_spec)
        leading = leaves[0].shape[0] if leaves and leaves[0].shape.rank else None
        if leading is None:
            leading = int(tf.shape(tf.nest.flatten(next(iter(dataset)))[0])[0])
        return int(leading) * replicas

    def resume(self, steps_per_epoch: int | None, num_workers: int = 1, in_step: bool = True) -> Resumption:
        if not self.markable(num_workers):
            unsaved = self.unsaved
            why = (f"tf.data can't save its pipelines' place ({unsaved}: state outside tf.data)" if unsaved else
                   "each worker's pipeline is its own" if num_workers > 1 else
                   "its pipelines are one per replica (InputReplicationMode.PER_REPLICA)")
            return Resumption(f"a dataset function's pipelines start again from their first batch: {why}")
        return Resumption(holds="the state of the function's tf.data pipeline at its pass's start, read on to the "
                                "step when resumed",
                          layout="on this layout, whose input context the pipeline was made for; on another, "
                                 "the pipelines start the epoch again from their first batch")

    def markable(self, num_workers: int) -> bool:
        """Whether a reader's place can be marked (`trainer/data/marks.py`): one worker, one pipeline, whose state
        tf.data can save. Several workers' pipelines are each their own, and a backup holds the chief's."""
        per_replica = (self.options is not None and self.options.experimental_replication_mode
                       == tf.distribute.InputReplicationMode.PER_REPLICA)
        return num_workers == 1 and not per_replica and not self.unsaved

    @functools.cached_property
    def unsaved(self) -> str:
        """Why tf.data can't save the state of the function's pipelines ("" when it can)."""
        return _compat.unsaved_state(self._probe())

    def reader(self, readers: Readers, epoch: int | None = None, start_step: int = 0, until: int | None = None,
               place: marks.Place | None = None):
        """The function's batches; with a `place` (a fit a callback resumes, `markable`), from there, read on
        from a marked iterator of its pipeline. Without one, a resumed run restarts the epoch."""
        del epoch, start_step, until
        if place is None or not self.markable(readers.num_workers):
            return DistributedBatches(iter(self._read_by(readers.strategy)))
        replicas, workers = readers.layout
        made = []

        def pipeline(context: tf.distribute.InputContext) -> tf.data.Dataset:
            iterator, mark = marks.iterator_at(self.fn(context), place, per_step=replicas // workers,
                                               layout=readers.layout)
            made.append(mark)
            return marks.read_on(iterator)

        dataset = readers.strategy.distribute_datasets_from_function(pipeline, self.options)
        return DistributedBatches(iter(dataset), mark=made[0])

    def per_worker_dataset(self, ctx: tf.distribute.InputContext, num_workers: int,
                           global_batch_size: int) -> tf.data.Dataset:
        return self.fn(ctx).repeat()

    def _read_by(self, strategy: tf.distribute.Strategy) -> Any:
        """The distributed dataset that `strategy`'s epochs read: the user's, else made here once."""
        if self.distributed is not None and _compat.distributed_source(self.distributed).strategy is strategy:
            return self.distributed
        return self._made(("distributed", id(strategy)),
                          lambda: strategy.distribute_datasets_from_function(self.fn, self.options))

    def _probe(self) -> tf.data.Dataset:
        """A dataset from the function to look at, read apart from those the steps read: the one made for an
        input context already, else one device's."""
        made = [d for d in self.__dict__.get("_datasets", {}).values() if isinstance(d, tf.data.Dataset)]
        return made[0] if made else self._made("one device", lambda: self.fn(tf.distribute.InputContext()))

    def _made(self, key: Any, make: Callable[[], Any]) -> Any:
        """What `make` makes (a dataset from `fn`), once per key."""
        made = self.__dict__.setdefault("_datasets", {})  # frozen: the cache is the instance's own
        if key not in made:
            made[key] = make()
        return made[key]


@dataclasses.dataclass(frozen=True)
class FileShardsInput(InputKind):
    """A dataset read from files, split by file into `shards` canonical shards (`Trainer(data_sharding="files")`).

    Shard s is the examples of the dataset's files s, s + shards, ... (tf.data's
    FILE policy, `_compat.file_shard`), repeated. Global step k takes the next
    `global_batch_size / shards` examples of every shard; replica r reads the
    shards r * shards / R to (r + 1) * shards / R and nothing else. So each
    worker reads only its shards' files, and every step's examples are the
    same on any number of replicas or workers that divides `shards` (the order
    within a batch aside): MosaicML Streaming's elastic determinism. They are
    not `model.fit`'s batches. The shards never run out: an epoch is fit's
    `steps_per_epoch`.
    """

    source: DatasetInput | BatchedInput
    shards: int
    global_batch_size: int
    form = "tf.data.Dataset read by file shards"
    num_examples = None

    @property
    def example_spec(self) -> Any:
        return self.source.example_spec

    def signature(self) -> Any:
        return self.source.signature()

    def _sharding(self, num_workers: int) -> tuple[str, str]:
        share = "all of the files" if num_workers == 1 else f"1/{num_workers} of the files"
        return ("FILE", f"{self.shards} file shards, {self.shards // num_workers} per worker: each worker reads "
                        f"{share}; the same numbers on any layout whose replicas divide {self.shards}, not "
                        "model.fit's batches (data_sharding='files')")

    def sample(self, n: int) -> Any:
        return self.source.sample(n)

    def resume(self, steps_per_epoch: int | None, num_workers: int = 1, in_step: bool = True) -> Resumption:
        return Resumption("the file shards are read again from their start")

    def examples(self) -> tf.data.Dataset:
        """The user's dataset as single examples."""
        return self.source.dataset if isinstance(self.source, DatasetInput) else self.source.dataset.unbatch()

    def replica_batches(self, context: tf.distribute.InputContext) -> tf.data.Dataset:
        """This worker's replicas' batches, step-major: for each local replica, the chunks of its shards."""
        replicas = context.num_replicas_in_sync
        local = replicas // context.num_input_pipelines
        per_replica, chunk = self.shards // replicas, self.global_batch_size // self.shards
        examples = self.examples()

        def replica(r: int) -> tf.data.Dataset:
            parts = tuple(_compat.file_shard(examples, self.shards, s).repeat().batch(chunk, drop_remainder=True)
                          for s in range(r * per_replica, (r + 1) * per_replica))
            if len(parts) == 1:
                return parts[0]
            return tf.data.Dataset.zip(parts).map(lambda *chunks: tf.nest.map_structure(
                lambda *t: tf.concat(t, axis=0), *chunks))

        mine = [replica(context.input_pipeline_id * local + j) for j in range(local)]
        if local == 1:
            return mine[0]
        return tf.data.Dataset.choose_from_datasets(mine, tf.data.Dataset.range(local).repeat())

    def reader(self, readers: Readers, epoch: int | None = None, start_step: int = 0, until: int | None = None,
               place: marks.Place | None = None):
        del epoch, start_step, until, place  # the shards' streams go on across epochs; a resume starts them again
        return DistributedBatches(iter(readers.strategy.distribute_datasets_from_function(self.replica_batches)))
