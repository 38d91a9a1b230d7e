"""The readers that step calls consume, and how each replica gets its share of a global step.

Three readers, made by `inputs.Readers`; each runs the compiled loops of
`steps.Loops` that fit it (`run`, `predictions`), so the steps never ask
what they were handed:

* `ArrayFeed`: arrays on CPU replicas, gathered inside the step.
* `GlobalBatches`: a dataset's global batches on CPU replicas, split inside the step.
* `DistributedBatches`: TensorFlow's distributed iterator (accelerators,
  dataset functions, datasets with a shard policy of their own).

Arrays need no tf.data pipeline. Each replica reads its slices of the global
batches from the user's NumPy arrays inside the step function: at the start of
a call, one `tf.numpy_function` per replica gathers its rows for all of the
call's steps (up to FETCH_BYTES), and each step slices its own out: one gather
per step would pay TensorFlow's py-function call on every step. There is no iterator to
create or destroy, no copy of the arrays into TensorFlow, and the global
example count of every step is known without a cross-replica sum. The slices
are exactly those of `arrays.array_dataset_fn` (which GPUs and TPUs still
use): the global order depends on the seed and the epoch only, and each
replica, on any worker, gathers its own contiguous share of each batch.

A tf.data dataset is read as whole global batches from one plain host
iterator per worker (`GlobalBatches`; on several workers, unless the dataset
sets a shard policy of its own, every worker reads all of it, as TensorFlow's
DATA policy does), and each replica takes its share of every batch inside the
step (`share_of`), cut the same way. TensorFlow's distributed
iterator would be set up again each epoch, and under MirroredStrategy its
MultiDeviceIterator traces functions for every device for every new iterator.

Both ways give each replica a `Share` of every step. A global batch with fewer
examples than there are replicas (the last one, say: 2 examples for 3
replicas) is not split: every replica computes on all of it, and the loss sum
is divided by the examples times the replicas, so the replicas' summed
gradients are still the one-device gradient, and synchronized BatchNormalization
sums as many copies of each example, so its mean and variance are still those of
the batch. Each replica's metrics count only its own share of the rows. No
replica ever runs a step on an empty batch: TensorFlow's oneDNN CPU kernels
abort on the gradient of Conv2D+BiasAdd or MaxPool over zero examples.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np
import tensorflow as tf

from trainer.data.arrays import OrderFn, computed_slices, fed_dtype, row_slice, take, uniform_rows
from trainer.distribute import strategy as strategy_lib
from trainer.distribute.cluster import is_parameter_server


ACCELERATOR_READER = "TRAINER_ACCELERATOR_READER"  # "1": CPU replicas read as accelerators do (tests)


def supports(strategy: tf.distribute.Strategy) -> bool:
    """Whether inputs should be fed this way: when the replicas are CPUs.

    On GPUs and TPUs the tf.data pipeline stays: it prefetches batches to the
    devices while they compute (and TPU replicas cannot run Python). Under
    parameter-server training, steps run on remote workers that hold no arrays.
    With TRAINER_ACCELERATOR_READER=1 in the environment, CPU replicas read as
    accelerators do, so that what GPUs run is what CPU-only tests run.
    """
    if os.environ.get(ACCELERATOR_READER) == "1":
        return False
    return not (is_parameter_server(strategy) or strategy_lib.runs_on_accelerators(strategy))


FETCH_BYTES = 8 * 2**20  # rows gathered per step call, at most (unless one step needs more)


class Share(NamedTuple):
    """One replica's part of one global step (replica context).

    Attributes:
      batch: the rows this replica computes on: its contiguous share of the
        global batch, or all of a global batch smaller than the replica count.
      global_count: rows computed on over all replicas (float32), the divisor of
        the loss sum; the examples in the step times the replicas that compute
        each of them.
      tracked: [begin, end) of `batch`, the rows this replica's metrics count;
        None for all of them.
      placed: (where `batch`'s first row sits in the global batch, the examples
        in the global batch), int64: what `draws` needs to give the replica its
        rows of one device's random draws. None where unknown.
    """

    batch: Any
    global_count: tf.Tensor
    tracked: tuple[tf.Tensor, tf.Tensor] | None = None
    placed: tuple[tf.Tensor, tf.Tensor] | None = None


class ArrayFeed:
    """Serves global steps of `epochs` over in-memory arrays, a call's worth at a time.

    Args:
      arrays: the arrays (a nested structure, one row per example).
      order: epoch -> the global order of the examples in that epoch.
      global_batch_size: examples per global step.
      num_replicas: replicas in sync (over all workers).
      epochs: the epochs this feed covers, in order.
      start_step: global steps to skip in the first epoch (a resumed run).
    """

    def __init__(self, arrays: Any, order: OrderFn, *, global_batch_size: int, num_replicas: int,
                 epochs: range = range(1), start_step: int = 0):
        self.leaves = [a for a in tf.nest.flatten(arrays) if a is not None]  # None: an optional input's absence
        # [steps, replicas]: where the rows each replica computes on start in the epoch order, how many,
        # and which of them it counts in the metrics.
        self._starts, self._sizes, self._tracked_begins, self._tracked_ends = computed_slices(
            len(self.leaves[0]), global_batch_size, num_replicas)
        self.steps_per_epoch = len(self._starts)
        step_bytes = global_batch_size * sum(a[:1].nbytes for a in self.leaves)
        self.steps_per_fetch = max(1, FETCH_BYTES // max(1, step_bytes))
        self._order_fn, self._epochs = order, iter(epochs)
        self._rows: np.ndarray | None = None
        self.step = start_step  # the next step of the current epoch
        # What the traced step loop depends on: structure, dtypes and per-example shapes, and the rows of a
        # replica's step when every step has the same (`step_batch`).
        self.signature = (tf.nest.map_structure(lambda a: None if a is None else 0, arrays),
                          tuple((fed_dtype(a).str, a.shape[1:]) for a in self.leaves), uniform_rows(self._sizes))

    def run(self, loops, num_steps: int) -> int:
        """Runs up to `num_steps` steps through `loops.feed`, a call per piece; returns how many ran."""
        loops.use_feed(self)
        ran = 0
        for first, count in self.fetches(num_steps):
            loops.feed(self.signature, tf.constant(first, tf.int64), tf.constant(count, tf.int64))
            ran += count
        return ran

    def predictions(self, loops) -> Iterator[Any]:
        """The outputs of `loops.feed`, one global batch after another."""
        loops.use_feed(self)
        for step, _ in iter(lambda: self.claim(1), (0, 0)):
            yield loops.feed(self.signature, tf.constant(step, tf.int64))

    def claim(self, num_steps: int) -> tuple[int, int]:
        """(first step, steps) for the next call: up to `num_steps` steps of the current epoch.

        Moves to the next epoch once the current one is done (also a first one
        resumed after its last step); (0, 0) when every epoch has been served.
        """
        while self._rows is None or self.step >= self.steps_per_epoch:
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
        """Claims up to `num_steps` steps and yields them as (first, count) pieces, one per step call.

        A piece holds at most `steps_per_fetch` steps, all with the same
        per-replica batch sizes: a step call is one `tf.while_loop`, and a
        collective whose shape changes between its iterations aborts (the
        all-gather of an Embedding's sparse gradient has a row per example).
        So the uneven last step of an epoch gets a call of its own.
        """
        first, count = self.claim(num_steps)
        end = first + count
        while first < end:
            same = np.all(self._sizes[first:end] == self._sizes[first], axis=1)
            uniform = int(np.argmin(same)) if not same.all() else end - first
            piece = min(self.steps_per_fetch, uniform)
            yield first, piece
            first += piece

    def replica_rows(self, first: int, count: int, replica: int) -> list[np.ndarray]:
        """`replica`'s rows of steps first..first+count-1 of the current epoch (NumPy).

        Returns the rows of every array, concatenated step after step; then where
        each step's rows begin and end ([count + 1] bounds); then each step's
        `Share.global_count` ([count]); then each step's tracked rows and
        `Share.placed` ([count, 4]: begin, end, first row, examples).
        """
        steps = slice(first, first + count)
        starts, sizes = self._starts[steps, replica], self._sizes[steps, replica]
        rows = np.concatenate([self._rows[s : s + n] for s, n in zip(starts, sizes)])
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        global_counts = self._sizes[steps].sum(axis=1).astype(np.float32)
        tracked = np.stack([self._tracked_begins[steps, replica], self._tracked_ends[steps, replica],
                            starts - self._starts[steps, 0],
                            (self._tracked_ends[steps] - self._tracked_begins[steps]).sum(axis=1)], axis=1)
        return [take(a, rows) for a in self.leaves] + [bounds, global_counts, tracked.astype(np.int64)]


Fetched = list  # the tensors of one `fetch`: rows of every array, step bounds, global counts, tracked rows


def fetch(current: Callable[[], ArrayFeed], first: tf.Tensor, count: tf.Tensor, signature: tuple) -> Fetched:
    """This replica's rows of steps first..first+count-1, in one gather (replica context).

    Args:
      current: returns the feed to read from when the step runs; the traced
        graph is reused across feeds with one signature.
      first, count: the steps, within the current epoch.
      signature: `ArrayFeed.signature` of every feed `current` may return.
    """
    _, leaves, _ = signature
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group

    def gather(first, count, replica):
        return current().replica_rows(int(first), int(count), int(replica))

    dtypes = [tf.as_dtype(np.dtype(dtype)) for dtype, _ in leaves] + [tf.int64, tf.float32, tf.int64]
    # Stateless: a pure function of its inputs within one call, so nothing orders it after other ops.
    tensors = tf.numpy_function(gather, [first, count, replica], dtypes, stateful=False)
    # ensure_shape, not set_shape: set_shape tells only Python, and Grappler, which then sees outputs of unknown
    # shape, rewrites the step's arithmetic otherwise than for Keras's own input (a ResNet's first loss was
    # 1 ulp off model.fit's, and BatchNormalization with momentum grew that to 1e-3 in two epochs).
    shapes = [(None, *shape) for _, shape in leaves] + [(None,), (None,), (None, 4)]
    return [tf.ensure_shape(tensor, shape) for tensor, shape in zip(tensors, shapes)]


def step_batch(fetched: Fetched, i: tf.Tensor, signature: tuple) -> Share:
    """Step `i` of a fetch: this replica's `Share` (replica context).

    When every step has the same rows, the batch has them as its static size,
    as Keras's own arrays have when they split into whole batches. TensorFlow
    computes some ops otherwise with an unknown size: the gradient of a Dense on
    a sequence rounded 1 ulp apart (in `model.fit` too, fed such a dataset).
    """
    structure, _, uniform = signature
    *rows, bounds, global_counts, tracked = fetched
    begin, end = bounds[i], bounds[i + 1]
    parts = [r[begin:end] for r in rows]
    if uniform is not None:
        parts = [tf.ensure_shape(part, (uniform, *part.shape[1:])) for part in parts]
    present = iter(parts)
    batch = tf.nest.pack_sequence_as(structure, [None if leaf is None else next(present)
                                                 for leaf in tf.nest.flatten(structure)])
    return Share(batch, global_counts[i], (tracked[i, 0], tracked[i, 1]), (tracked[i, 2], tracked[i, 3]))


def first_leaf(batch: Any) -> Any:
    """The first tensor of a batch, whose rows are the batch's (None leaves, an optional input's absence, have
    none)."""
    return next(leaf for leaf in tf.nest.flatten(batch) if leaf is not None)


def share_of(batch: Any) -> Share:
    """This replica's `Share` of a whole global batch (replica context).

    The shares are cut as `computed_slices` cuts them: contiguous, with sizes
    that differ by at most one, the first replicas taking the extra examples;
    a batch smaller than the replica count is computed whole by every replica.
    Replicas on CPUs share the host's memory, so each reads its rows of the one
    batch in place.
    """
    context = tf.distribute.get_replica_context()
    replicas = context.num_replicas_in_sync
    size = tf.shape(first_leaf(batch), tf.int64)[0]
    if replicas == 1:  # nothing to cut
        return Share(batch, tf.cast(size, tf.float32), placed=(tf.constant(0, tf.int64), size))
    return _cut(batch, size, tf.cast(context.replica_id_in_sync_group, tf.int64), replicas)


def _cut(batch: Any, size: tf.Tensor, replica: tf.Tensor, replicas: int) -> Share:
    """`replica`'s `Share` of a global batch of `size` examples (int64), cut as `computed_slices` cuts."""
    base, extra = size // replicas, size % replicas
    begin = replica * base + tf.minimum(replica, extra)
    end = begin + base + tf.cast(replica < extra, tf.int64)
    whole = size < replicas
    first = tf.where(whole, tf.constant(0, tf.int64), begin)
    last = tf.where(whole, size, end)
    global_count = tf.cast(size * tf.where(whole, tf.constant(replicas, tf.int64), 1), tf.float32)
    return Share(tf.nest.map_structure(lambda t: row_slice(t, first, last), batch), global_count,
                 (begin - first, end - first), (first, size))


class Cut(NamedTuple):
    """A replica's `Share` cut in the input pipeline, as a dataset element (`cut_shares`).

    TensorFlow's distributed iterator fails on a None part (its optional's spec has no shape), so an optional
    input's absence travels as an empty marker (`_ABSENT`), which `share` turns back into None.
    """

    batch: Any
    global_count: tf.Tensor  # float32
    tracked: tf.Tensor  # int64[2]: Share.tracked
    placed: tf.Tensor  # int64[2]: Share.placed

    @classmethod
    def of(cls, share: Share) -> Cut:
        return cls.carrying(share.batch, share.global_count, tf.stack(share.tracked), tf.stack(share.placed))

    @classmethod
    def carrying(cls, batch: Any, global_count: tf.Tensor, tracked: tf.Tensor, placed: tf.Tensor) -> Cut:
        marked = tf.nest.map_structure(lambda t: tf.zeros(_ABSENT.shape, _ABSENT.dtype) if t is None else t, batch)
        return cls(marked, global_count, tracked, placed)

    def share(self) -> Share:
        batch = tf.nest.map_structure(lambda t: None if _is_absent(t) else t, self.batch)
        return Share(batch, self.global_count, (self.tracked[0], self.tracked[1]), (self.placed[0], self.placed[1]))


# The marker of a None part: no batch is a bool vector of no rows (`feed` never hands a replica an empty batch).
_ABSENT = tf.TensorSpec([0], tf.bool)


def _is_absent(t: Any) -> bool:
    return isinstance(t, tf.Tensor) and t.dtype == tf.bool and t.shape.rank == 1 and t.shape[0] == 0  # static


def cut_shares(global_batches: tf.data.Dataset, context: tf.distribute.InputContext) -> tf.data.Dataset:
    """This worker's replicas' `Cut`s of each global batch, step after step, one per local replica: the order
    in which tf.distribute hands a per-worker dataset's elements to the replicas.

    The shares are `share_of`'s, cut before the devices: each replica is
    handed its own rows (all of a batch smaller than the replica count), and
    the pipeline prefetches them to its device. Every worker reads every batch
    and keeps its replicas' shares, as with the DATA shard policy.
    """
    replicas = context.num_replicas_in_sync
    local = replicas // context.num_input_pipelines
    first_replica = context.input_pipeline_id * local

    def cuts(*parts):
        batch = parts[0] if len(parts) == 1 else parts
        size = tf.shape(first_leaf(batch), tf.int64)[0]
        return tf.data.Dataset.range(local).map(
            lambda i: Cut.of(_cut(batch, size, first_replica + i, replicas)))

    return global_batches.flat_map(cuts)


class GlobalBatches:
    """A plain iterator of a dataset's global batches, which the replicas split (`share_of`).

    A step call runs steps of one shape only (see `ArrayFeed.fetches`). A batch
    whose shapes differ from those of the call's first step ends the call unrun:
    it is `held` here, and it is the first step of the next call.
    """

    def __init__(self, dataset: tf.data.Dataset):
        self.iterator = iter(dataset)
        self.held = tf.experimental.Optional.empty(self.iterator.element_spec)
        self.composite = has_composite(dataset.element_spec)  # see `DistributedBatches`

    def run(self, loops, num_steps: int) -> int:
        """Runs up to `num_steps` steps through `loops.global_batches`; returns how many ran."""
        ran = 0
        while ran < num_steps:
            wanted = 1 if self.composite else num_steps - ran
            executed, self.held = loops.global_batches(self.iterator, self.held, tf.constant(wanted))
            ran += int(executed)
            if not self.held.has_value() and (not self.composite or not executed):  # the steps ran, or the data ended
                break
        return ran

    def predictions(self, loops) -> Iterator[Any]:
        """The outputs of `loops.global_batch`, one global batch after another."""
        for batch in self.iterator:
            yield loops.global_batch(batch)


class DistributedBatches:
    """TensorFlow's distributed iterator: each replica is handed a batch of its own (`whole_share`).

    For replicas on accelerators (whose pipelines prefetch to the device),
    dataset functions, and datasets that set a shard policy of their own.

    `composite`: the batches hold ragged or sparse tensors, whose shapes (and
    those of the sparse gradients they give, e.g. an Embedding's) change from
    step to step and from replica to replica; a collective whose shape changes
    inside a call's loop aborts (see trainer/engine/steps.py), so each step runs in a
    call of its own.
    """

    def __init__(self, iterator: Any, *, composite: bool = False):
        self.iterator, self.composite = iterator, composite

    def run(self, loops, num_steps: int) -> int:
        """Runs up to `num_steps` steps through `loops.distributed`; returns how many ran."""
        if not self.composite:
            return int(loops.distributed(self.iterator, tf.constant(num_steps)))
        ran = 0
        while ran < num_steps and int(loops.distributed(self.iterator, tf.constant(1))):
            ran += 1
        return ran

    def predictions(self, loops) -> Iterator[Any]:
        """The outputs of `loops.replica_batch`, one global batch after another."""
        for batch in self.iterator:
            yield loops.replica_batch(batch)


def has_composite(element_spec: Any) -> bool:
    """Whether elements of `element_spec` hold ragged or sparse tensors."""
    return any(isinstance(spec, (tf.RaggedTensorSpec, tf.SparseTensorSpec)) for spec in tf.nest.flatten(element_spec))


def shape_key(batch: Any) -> tf.Tensor:
    """Every dimension of every tensor in `batch`, as one int32 vector (the leading ones only if a rank is unknown)."""
    leaves = [t for t in tf.nest.flatten(batch) if t is not None]
    if any(t.shape.rank is None for t in leaves):
        return tf.stack([_rows(t) for t in leaves])
    return tf.concat([_dims(t) for t in leaves], axis=0)


def spec_rank(spec: Any, absent: Any = None) -> int | None:
    """A spec's rank (None: unknown); `absent` for the spec of what is always None (`NoneTensorSpec`, an optional
    input's absence), which has no shape."""
    return spec.shape.rank if hasattr(spec, "shape") else absent


def shape_key_length(element_spec: Any) -> int:
    """The length of `shape_key` for batches of `element_spec`."""
    specs = [spec for spec in tf.nest.flatten(element_spec) if hasattr(spec, "shape")]  # not NoneTensorSpec
    ranks = [spec.shape.rank for spec in specs]
    if None in ranks:
        return len(ranks)
    return sum(1 + spec.shape.rank - spec.ragged_rank if isinstance(spec, tf.RaggedTensorSpec) else spec.shape.rank
               for spec in specs)


def _rows(t: Any) -> tf.Tensor:
    return tf.cast(t.nrows(), tf.int32) if isinstance(t, tf.RaggedTensor) else tf.shape(t)[0]


def _dims(t: Any) -> tf.Tensor:
    """A tensor's dimensions; a ragged one's rows and the dimensions of its values."""
    if isinstance(t, tf.RaggedTensor):
        return tf.concat([[_rows(t)], tf.shape(t.flat_values)], axis=0)
    if isinstance(t, tf.SparseTensor):
        return tf.cast(t.dense_shape, tf.int32)
    return tf.shape(t)


def handed_share(element: Any) -> Share:
    """The `Share` a distributed iterator handed the replica: a `Cut`, or a batch the iterator cut."""
    return element.share() if isinstance(element, Cut) else whole_share(element)


def whole_share(batch: Any) -> Share:
    """A `Share` of a batch that the replica was handed by a distributed iterator (replica context).

    The iterator hands the replicas consecutive parts of each global batch, in
    replica order; one all-reduce of every replica's count tells each where
    its part starts.
    """
    context = tf.distribute.get_replica_context()
    count = tf.cast(tf.shape(first_leaf(batch))[0], tf.int64)
    if context.num_replicas_in_sync == 1:
        return Share(batch, tf.cast(count, tf.float32), placed=(tf.constant(0, tf.int64), count))
    replica = context.replica_id_in_sync_group
    one_hot = tf.one_hot(replica, context.num_replicas_in_sync) * tf.cast(count, tf.float32)
    counts = tf.cast(context.all_reduce("SUM", one_hot), tf.int64)  # exact: whole numbers below 2**24
    examples = tf.reduce_sum(counts)
    return Share(batch, tf.cast(examples, tf.float32), placed=(tf.reduce_sum(counts[:replica]), examples))


def tracked(share: Share, values: Any) -> Any:
    """The rows of `values` (computed on `share.batch`) that the replica's metrics count."""
    if share.tracked is None:
        return values
    begin, end = share.tracked
    return tf.nest.map_structure(lambda t: row_slice(t, begin, end), values)
