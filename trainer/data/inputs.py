"""The input kinds, each with its whole contract, and the readers the steps consume.

`trainer/data/boundary.py` checks what the user passed and wraps it as one of these
kinds; from then on the trainer asks the kind, never its type:

| Kind | Global batch | Split across workers | Split across replicas | Each pass | Mid-epoch resume |
|---|---|---|---|---|---|
| `ArrayInput` | fit's `batch_size` | each worker gathers its replicas' slices | contiguous slices | reshuffled from `seed` and the pass | exact: skips steps |
| `DatasetInput` | batched here | every worker reads all, keeps its share (DATA) | contiguous shares | read again from its start | exact: skips examples |
| `BatchedInput` | the user's batches | every worker reads all, keeps its share (DATA); grain's `.batch()`: its records only | contiguous shares | read again; Keras's spare iterator | exact: skips batches |
| `FunctionInput` | the function's | by its `input_context` | a pipeline per replica | read again | restarts the epoch |
| `FileShardsInput` | the dataset's | by file shards (`data_sharding="files"`) | each replica its shards | read on | restarts the shards |

A `Readers` makes, for one strategy and global batch, what a step call reads
from an input (`kind.reader`): an `ArrayFeed` (arrays on CPU replicas),
`GlobalBatches` (datasets on CPU replicas) or `DistributedBatches`
(TensorFlow's distributed iterator: accelerators, dataset functions, datasets
with a shard policy of their own). Each reader runs the step loops that fit it
(`feed.py`). Under parameter-server training, `per_worker_dataset` gives each
worker its own repeated stream instead.
"""  # noqa: E501 (the Markdown table's rows)

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from trainer import _compat
from trainer.data import arrays as arrays_lib
from trainer.data import feed
from trainer.data.feed import spec_rank
from trainer.distribute.cluster import strategy_cluster_info

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]

_PER_WORKER = ("per worker", "each worker reads its own shard, shuffled and repeated; steps go to free workers")


class _Input:
    """What every kind answers; the defaults are those of a kind with no Python-side epoch hooks.

    Every kind also has `form` (its name in the plan and in messages),
    `num_examples` (examples in one pass, or None when unknown), `sample(n)`
    (a batch to build the model on), `reader(...)` (see `Readers`) and
    `per_worker_dataset(...)` (parameter-server training).
    """

    num_examples: int | None

    def num_steps(self, global_batch_size: int) -> int | None:
        """Global steps in one pass, or None when unknown."""
        return None if self.num_examples is None else -(-self.num_examples // global_batch_size)

    def signature(self) -> Any:
        """Structure of (x, y[, w]) with per-example shapes, for comparing two inputs; None when unknown."""
        return None

    @property
    def unknown_to_keras(self) -> bool:
        """Whether model.fit can't tell a pass's length, and so finds its end by a call past it."""
        return self.num_steps(1) is None

    def sharding(self, num_workers: int, *, parameter_server: bool = False) -> tuple[str, str]:
        """(policy, reason) of how the input is split across workers, for the plan."""
        return _PER_WORKER if parameter_server else self._sharding(num_workers)

    def _sharding(self, num_workers: int) -> tuple[str, str]:
        raise NotImplementedError

    # Whether each pass over the input gets a reader of its own (`loop.ReaderSteps`); arrays read all the
    # passes of a fit through one, which shuffles each.
    reader_per_pass = True

    def resume(self, steps_per_epoch: int | None) -> str:
        """Why a run resumed mid-fit reads other batches than the uninterrupted run would ("" if it can't)."""
        return ""

    def epoch_begin(self) -> None:
        """Starts an epoch of reading (a PyDataset's workers)."""

    def epoch_end(self, *, read_all: bool) -> list:
        """Ends an epoch of reading; returns iterators for the caller to release (`eval_loop.release`)."""
        return []


@dataclasses.dataclass(frozen=True)
class ArrayInput(_Input):
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

    def reader(self, readers: Readers, epoch: int | None = None, start_step: int = 0, until: int | None = None):
        """Epochs `epoch` to `until` (one by default), each shuffled from the seed; without `epoch`, input order
        once (ragged or sparse arrays: one pass a reader)."""
        order = readers.order(self.num_examples, per_epoch=epoch is not None)
        if self.composite:
            batches = self.composite_batches(order(epoch or 0), readers.global_batch_size, start_step)
            if readers.in_step:
                return feed.GlobalBatches(batches)
            return feed.DistributedBatches(iter(readers.strategy.distribute_datasets_from_function(
                lambda context: feed.cut_shares(batches, context))), composite=True)
        epochs = range(1) if epoch is None else range(epoch, until or epoch + 1)
        if readers.in_step:
            return feed.ArrayFeed(self.arrays, order, global_batch_size=readers.global_batch_size,
                                  num_replicas=readers.strategy.num_replicas_in_sync, epochs=epochs,
                                  start_step=start_step)
        fn = arrays_lib.array_dataset_fn(self.host(), self.num_examples, order, readers.global_batch_size, epochs,
                                         start_step)
        return feed.DistributedBatches(iter(readers.strategy.distribute_datasets_from_function(
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
        ds = ds.shard(num_workers, _worker_index())
        return ds.shuffle(-(-self.num_examples // num_workers)).repeat().batch(global_batch_size)


class _DatasetKind(_Input):
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

    def resume(self, steps_per_epoch: int | None) -> str:
        if steps_per_epoch is not None and self.num_steps(1) is None:
            return ("steps_per_epoch cuts one stream of the dataset into epochs, and the dataset's length is "
                    "unknown, so a resumed run reads the stream from its start")
        shuffles = _compat.dataset_shuffles(self.dataset)
        if any(reshuffles for reshuffles, _ in shuffles):
            return ("the dataset reshuffles each time it is read (shuffle's reshuffle_each_iteration), and a "
                    "resumed run's first read is in the first epoch's order")
        if not all(seeded for _, seeded in shuffles):
            return "the dataset shuffles without a seed, so a resumed run reads it in another order"
        return ""

    def global_batches(self, global_batch_size: int, start_step: int = 0) -> tf.data.Dataset:
        """The dataset in global batches (the last one partial), from global step `start_step` on."""
        raise NotImplementedError

    def worker_batches(self, readers: Readers, start_step: int = 0) -> tf.data.Dataset:
        """The global batches as this worker reads them, of which its replicas take their shares."""
        return self.global_batches(readers.global_batch_size, start_step)

    def reader(self, readers: Readers, epoch: int | None = None, start_step: int = 0, until: int | None = None):
        """Global batches from `start_step` on (the epochs are the loop's: each reads the dataset again)."""
        del epoch, until
        chosen = self.dataset.options().experimental_distribute.auto_shard_policy
        trainer_cut = readers.num_workers == 1 or chosen == tf.data.experimental.AutoShardPolicy.AUTO
        if readers.in_step and trainer_cut:
            # Every worker reads its share of each batch (all of it, as the DATA policy would, unless the batches
            # can be read by record); the steps split it.
            return feed.GlobalBatches(self.worker_batches(readers, start_step))
        return readers.distributed(self, start_step, cut=trainer_cut)


@dataclasses.dataclass(frozen=True)
class DatasetInput(_DatasetKind):
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
        return self.dataset.shard(num_workers, _worker_index()).repeat().batch(global_batch_size)


@dataclasses.dataclass(frozen=True)
class BatchedInput(_DatasetKind):
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
        return self.dataset.shard(num_workers, _worker_index()).repeat()  # whole batches go to a free worker


@dataclasses.dataclass(frozen=True)
class FunctionInput(_Input):
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

    def resume(self, steps_per_epoch: int | None) -> str:
        return "a dataset function's pipelines start again from their first batch"

    def reader(self, readers: Readers, epoch: int | None = None, start_step: int = 0, until: int | None = None):
        del epoch, start_step, until  # it restarts the epoch
        return feed.DistributedBatches(iter(self._read_by(readers.strategy)))

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
class FileShardsInput(_Input):
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

    def resume(self, steps_per_epoch: int | None) -> str:
        return "the file shards are read again from their start"

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

    def reader(self, readers: Readers, epoch: int | None = None, start_step: int = 0, until: int | None = None):
        del epoch, start_step, until  # the shards' streams go on across epochs; a resumed run starts them again
        return feed.DistributedBatches(iter(readers.strategy.distribute_datasets_from_function(self.replica_batches)))


Input = ArrayInput | DatasetInput | BatchedInput | FunctionInput | FileShardsInput


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


def _composite(array: Any) -> bool:
    """Whether `array` is a ragged or sparse tensor, which tf.data gathers (`ArrayInput.composite_batches`)."""
    return isinstance(array, (tf.RaggedTensor, tf.SparseTensor))


def _worker_index() -> tf.Tensor:
    """The parameter-server worker running a per-worker dataset function (known at run time).

    The function is traced once and runs on every worker, so shuffle seeds are
    the same everywhere; sharding by this index keeps the workers' streams apart.
    """
    return tf.distribute.coordinator.experimental_get_current_worker_index()


class Readers:
    """Makes what step calls read from an input, for one strategy and global batch.

    `readers(inp, epoch=None, start_step=0, until=None)`: with `epoch`, arrays
    are shuffled per epoch (from `seed`) and one reader covers epochs `epoch`
    to `until` (exclusive; one epoch by default); without it, they are read
    once in input order. `start_step` skips global steps at the start (a
    resumed run).
    """

    def __init__(self, strategy: tf.distribute.Strategy, global_batch_size: int, *, shuffle: bool, seed: int):
        self.strategy = strategy
        self.global_batch_size = global_batch_size
        self.shuffle, self.seed = shuffle, seed
        cluster = strategy_cluster_info(strategy)
        self.num_workers = cluster.num_workers
        local = strategy.num_replicas_in_sync // self.num_workers
        self._worker_replicas = range(cluster.rank * local, (cluster.rank + 1) * local)
        self.in_step = feed.supports(strategy)  # CPU replicas read in the step, not through tf.distribute
        # A dataset read from its start is distributed once and iterated again each epoch:
        # distributing it rewrites its graph, which costs milliseconds each time.
        self._distributed: list[tuple[Input, Any]] = []

    def __call__(self, inp: Input, epoch: int | None = None, start_step: int = 0, until: int | None = None):
        return inp.reader(self, epoch, start_step, until)

    def worker_rows(self, size: int) -> tuple[int, int]:
        """[begin, end) of the rows of a global batch of `size` examples that this worker's replicas compute on."""
        return arrays_lib.computed_rows(size, self._worker_replicas, self.strategy.num_replicas_in_sync)

    def order(self, num_examples: int, *, per_epoch: bool) -> arrays_lib.OrderFn:
        """epoch -> the order of the examples: each epoch's, from the seed (when shuffling); else as given."""
        if not per_epoch:
            return lambda epoch: np.arange(num_examples)
        return lambda epoch: arrays_lib.epoch_order(num_examples, shuffle=self.shuffle, seed=self.seed, epoch=epoch)

    def distributed(self, inp: _DatasetKind, start_step: int, *, cut: bool) -> feed.DistributedBatches:
        """TensorFlow's distributed iterator over `inp`'s global batches: each replica handed the share the
        trainer cuts (`feed.cut_shares`) with `cut`, else split by the dataset's own shard policy."""
        if start_step == 0:
            for known, dataset in self._distributed:
                if known is inp:
                    return feed.DistributedBatches(iter(dataset), composite=feed.has_composite(inp.example_spec))
        if cut:
            batches = inp.worker_batches(self, start_step)
            dataset = self.strategy.distribute_datasets_from_function(lambda context: feed.cut_shares(batches, context))
        else:
            policy, _ = shard_policy(inp.dataset, self.num_workers)
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = policy
            dataset = self.strategy.experimental_distribute_dataset(
                inp.global_batches(self.global_batch_size, start_step).with_options(options))
        if start_step == 0:
            self._distributed.append((inp, dataset))
        return feed.DistributedBatches(iter(dataset), composite=feed.has_composite(inp.example_spec))
