"""Datasets as input kinds, read as global batches: a `tf.data.Dataset` of examples that the trainer batches
(`DatasetInput`), and batches the user made (`BatchedInput`: a batched dataset, a generator, a PyDataset or a
grain dataset); and the auto-shard policy a dataset is read with on several workers (`shard_policy`).

None of it iterates a dataset through (a repeated one never ends): what it knows comes from the element
spec, the cardinality and the options, or from one batch at most.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, Callable

import tensorflow as tf

from trainer import _compat
from trainer.data import feed, marks
from trainer.data.input_kind import InputKind, Resumption, worker_index
from trainer.data.readers import GlobalBatches
from trainer.data.specs import spec_rank

if TYPE_CHECKING:
    from trainer.data.inputs import Readers


class DatasetKind(InputKind):
    """A `tf.data.Dataset` (`self.dataset`) read as global batches."""

    dataset: tf.data.Dataset

    def signature(self) -> Any:
        spec = self.example_spec
        if any(spec_rank(s, 0) is None for s in tf.nest.flatten(spec)):
            return None  # unknown; checks.check_data refuses it
        parts = tuple(spec) if isinstance(spec, (tuple, list)) else (spec,)  # x alone, as arrays pack it
        return tf.nest.map_structure(lambda s: tuple(s.shape) if hasattr(s, "shape") else None, parts)

    def _sharding(self, num_workers: int) -> tuple[str, str]:
        policy, reason = shard_policy(self.dataset, num_workers)
        return policy.name, reason

    def resume(self, steps_per_epoch: int | None, num_workers: int = 1, in_step: bool = True) -> Resumption:
        stream = steps_per_epoch is not None and self.num_steps(1) is None
        if self.markable(num_workers):
            if not stream:
                where = "its pass's start (a shuffle's seeds, no examples)"
            elif in_step:
                where = "each epoch's start (with its shuffle and prefetch buffers)"
            else:
                where = "its stream's start (the distributed iterator reads ahead of the steps)"
            return Resumption(holds=f"the tf.data pipeline's state at {where}, read on to the step when resumed")
        unsaved = self.unsaved
        why = f"tf.data can't save this pipeline's place ({unsaved}: state outside tf.data)" if unsaved else (
            "each worker reads its own shard of the dataset (a shard policy set on it)")
        if stream:
            return Resumption(f"steps_per_epoch cuts one stream of the dataset into epochs, and {why}, so a resumed "
                              "run reads the stream from its start")
        shuffles = _compat.dataset_shuffles(self.dataset)
        if any(reshuffles for reshuffles, _ in shuffles):
            return Resumption(f"the dataset reshuffles each time it is read (shuffle's reshuffle_each_iteration), "
                              f"and {why}, so a resumed run's first read is in the first epoch's order")
        if not all(seeded for _, seeded in shuffles):
            return Resumption(f"the dataset shuffles without a seed, and {why}, so a resumed run reads it in "
                              "another order")
        return Resumption(holds="the epoch and step; the resumed run reads the pass again to the step")

    def global_batches(self, global_batch_size: int, start_step: int = 0) -> tf.data.Dataset:
        """The dataset in global batches (the last one partial), from global step `start_step` on."""
        raise NotImplementedError

    def markable(self, num_workers: int) -> bool:
        """Whether a reader's place can be marked (`trainer/data/marks.py`): every worker reads the same global
        batches, cut by the trainer, from a pipeline whose state tf.data can save."""
        chosen = self.dataset.options().experimental_distribute.auto_shard_policy
        whole = num_workers == 1 or (chosen == tf.data.experimental.AutoShardPolicy.AUTO
                                     and getattr(self, "by_rows", None) is None)
        return whole and not self.unsaved

    @functools.cached_property
    def unsaved(self) -> str:
        """Why tf.data can't save the state of the dataset's iterators ("" when it can), found once: it
        serializes the dataset's graph, constants included."""
        return _compat.unsaved_state(self.dataset)

    def worker_batches(self, readers: Readers, start_step: int = 0) -> tf.data.Dataset:
        """The global batches as this worker reads them, of which its replicas take their shares."""
        return self.global_batches(readers.global_batch_size, start_step)

    def reader(self, readers: Readers, epoch: int | None = None, start_step: int = 0, until: int | None = None,
               place: marks.Place | None = None):
        """Global batches from `start_step` on (the epochs are the loop's: each reads the dataset again); with a
        `place` (a fit a callback resumes, `markable`), the marked global batches from there."""
        del epoch, until
        if place is not None and self.markable(readers.num_workers):
            batches = self.worker_batches(readers)
            return GlobalBatches(batches, place) if readers.in_step else readers.read_on(batches, place)
        chosen = self.dataset.options().experimental_distribute.auto_shard_policy
        trainer_cut = readers.num_workers == 1 or chosen == tf.data.experimental.AutoShardPolicy.AUTO
        if readers.in_step and trainer_cut:
            # Every worker reads its share of each batch (all of it, as the DATA policy would, unless the batches
            # can be read by record); the steps split it.
            return GlobalBatches(self.worker_batches(readers, start_step))
        return readers.distributed(self, start_step, cut=trainer_cut)


@dataclasses.dataclass(frozen=True)
class DatasetInput(DatasetKind):
    """A `tf.data.Dataset` of single examples; the trainer batches it with the global batch, in the order it yields."""

    dataset: tf.data.Dataset
    form = "tf.data.Dataset"

    @property
    def num_examples(self) -> int | None:
        n = int(self.dataset.cardinality())
        return n if n >= 0 else None

    @property
    def example_spec(self) -> Any:
        return self.dataset.element_spec

    def global_batches(self, global_batch_size: int, start_step: int = 0) -> tf.data.Dataset:
        ds = self.dataset.skip(start_step * global_batch_size) if start_step else self.dataset
        return ds.batch(global_batch_size).prefetch(tf.data.AUTOTUNE)

    def sample(self, n: int) -> Any:
        return next(iter(self.dataset.batch(n)))

    def per_worker_dataset(self, ctx: tf.distribute.InputContext, num_workers: int,
                           global_batch_size: int) -> tf.data.Dataset:
        return self.dataset.shard(num_workers, worker_index()).repeat().batch(global_batch_size)


@dataclasses.dataclass(frozen=True)
class BatchedInput(DatasetKind):
    """Batches the user made, each one global step as under `model.fit`.

    A batched tf.data.Dataset (`.batch(64)`, `drop_remainder`, `.prefetch`,
    ...), a Python generator of batches, or a `keras.utils.PyDataset`, read
    through Keras's own adapters so that its workers, queue and epoch hooks
    behave as under `model.fit`. Every worker reads every batch and keeps its
    replicas' rows.

    Attributes:
      dataset: the global batches, as a tf.data.Dataset.
      form: "batched dataset", "generator" or "PyDataset", for the plan and messages.
      batch_size: rows in a full batch (the global batch), when known without reading.
      num_batches: batches in one pass, when known.
      example_spec: per-example `tf.TensorSpec`s of an element, for checks against the model.
      adapter: Keras's adapter of a generator or PyDataset (its epoch hooks start and stop
        a PyDataset's workers), else None.
      first: a batch to build the model on, when one could be read without side effects.
      by_rows: for batches that can be read record by record (a grain MapDataset batched by `.batch()`),
        `rows -> ` the batches with only rows [begin, end) = rows(batch size) of each read: on several
        workers, each reads its replicas' rows only. None where each batch comes whole.
    """

    dataset: tf.data.Dataset
    form: str
    batch_size: int | None
    num_batches: int | None
    example_spec: Any
    adapter: Any = dataclasses.field(default=None, compare=False, repr=False)
    first: Any = dataclasses.field(default=None, compare=False, repr=False)
    by_rows: Callable[[Callable[[int], tuple[int, int]]], tf.data.Dataset] | None = dataclasses.field(
        default=None, compare=False, repr=False)
    num_examples = None

    def num_steps(self, global_batch_size: int) -> int | None:
        return self.num_batches

    def _sharding(self, num_workers: int) -> tuple[str, str]:
        if self.adapter is None:
            return super()._sharding(num_workers)
        if num_workers == 1:
            return "OFF", f"one worker reads the {self.form}"
        if self.by_rows is not None:
            return ("OFF", f"each worker reads only its replicas' records of every batch of the {self.form} "
                    f"(1/{num_workers} of them): one device's numbers")
        return ("OFF", f"every worker reads every batch of the {self.form} (it yields whole batches) and keeps "
                "its replicas' rows: one device's numbers")

    def global_batches(self, global_batch_size: int, start_step: int = 0) -> tf.data.Dataset:
        return self.dataset.skip(start_step) if start_step else self.dataset

    def worker_batches(self, readers: Readers, start_step: int = 0) -> tf.data.Dataset:
        if self.by_rows is None or readers.num_workers == 1:
            return super().worker_batches(readers, start_step)
        batches = self.by_rows(readers.worker_rows)
        return batches.skip(start_step) if start_step else batches

    def full_batch_size(self) -> int:
        """Rows in a full batch (the global batch): declared, or read from the first batch."""
        if self.batch_size is not None:
            return self.batch_size
        first = self.first if self.first is not None else next(iter(self.dataset))
        return int(tf.shape(feed.first_leaf(first))[0])

    def sample(self, n: int) -> Any:
        """The batch Keras peeked at; else `n` examples of zeros (empty strings) shaped as the elements.

        Reading a batch would start an iterator on the user's dataset, and a
        `.shuffle(reshuffle_each_iteration=True)` in it would then give every
        epoch the order of the next one: `model.fit` reads none before
        training. Only an element with an open shape is read.
        """
        if self.first is not None:
            return self.first
        if any(hasattr(s, "shape") and not s.shape.is_fully_defined() for s in tf.nest.flatten(self.example_spec)):
            return next(iter(self.dataset))

        def zeros(spec):
            if not hasattr(spec, "shape"):  # NoneTensorSpec: an optional input's absence
                return None
            shape = [n, *spec.shape]
            return tf.fill(shape, "") if spec.dtype == tf.string else tf.zeros(shape, spec.dtype)

        return tf.nest.map_structure(zeros, self.example_spec)

    def epoch_begin(self) -> None:
        if self.adapter is not None:
            self.adapter.on_epoch_begin()

    def epoch_end(self, *, read_all: bool) -> list:
        """Stops a PyDataset's workers; after a whole pass of a batched dataset, starts Keras's spare iterator.

        After reading all of a batched dataset of known length, Keras's epoch
        iterator starts a new iterator on it (and drops it when the next epoch
        starts another): that advances a `.shuffle(reshuffle_each_iteration=True)`
        in the dataset by one order, so every epoch of `model.fit` skips one.
        The trainer does the same, so that the epochs read the examples in
        `model.fit`'s order.
        """
        if self.adapter is not None:
            self.adapter.on_epoch_end()
        elif read_all and self.num_batches:
            return [iter(self.dataset)]
        return []

    def per_worker_dataset(self, ctx: tf.distribute.InputContext, num_workers: int,
                           global_batch_size: int) -> tf.data.Dataset:
        return self.dataset.shard(num_workers, worker_index()).repeat()  # whole batches go to a free worker


def shard_policy(dataset: tf.data.Dataset, num_workers: int) -> tuple[Any, str]:
    """The auto-shard policy for a user dataset, and the reason, for the plan."""
    policy_enum = tf.data.experimental.AutoShardPolicy
    chosen = dataset.options().experimental_distribute.auto_shard_policy
    # tf.data service sets OFF on a dataset reading a job by name, which its readers share
    shared = [job for job in _compat.service_jobs(dataset) if job] if num_workers > 1 else []
    if shared and chosen == policy_enum.OFF:
        return chosen, (f"the workers share the tf.data service job {shared[0]!r}, which hands each other batches, "
                        "and TensorFlow's strategy cuts each worker's over its replicas: not one device's numbers")
    if chosen != policy_enum.AUTO:
        return chosen, "set on the dataset by the user"
    if num_workers == 1:
        return policy_enum.OFF, "one worker reads everything; nothing to shard"
    return policy_enum.DATA, (f"every worker reads all of the data ({num_workers}x the reading in all) and keeps its "
                              "share of each batch: one device's numbers, for any source; "
                              f"Trainer(data_sharding='files') reads 1/{num_workers} by file")
