"""Inside the step: each replica's `Share` of a global step, from what its reader hands the step.

The step loops call, in replica context, the way that fits the reader: `fetch` and `step_batch` for an
`ArrayFeed`, `share_of` for a whole global batch, `handed_share` for what TensorFlow's distributed iterator
handed the replica. No replica may run a step on an empty batch, and nothing here keeps state between steps.
A batch smaller than the replica count: docs/exactness.md, "The uneven last batch".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import numpy as np
import tensorflow as tf

from trainer.data.arrays import row_slice

if TYPE_CHECKING:
    from trainer.data.readers import ArrayFeed


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


def shape_key(batch: Any) -> tf.Tensor:
    """Every dimension of every tensor in `batch`, as one int32 vector (the leading ones only if a rank is unknown)."""
    leaves = [t for t in tf.nest.flatten(batch) if t is not None]
    if any(t.shape.rank is None for t in leaves):
        return tf.stack([_rows(t) for t in leaves])
    return tf.concat([_dims(t) for t in leaves], axis=0)


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
