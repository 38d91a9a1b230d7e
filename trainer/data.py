"""User inputs -> sharded, distributed batches.

Three kinds of input are accepted:

* Arrays: `(x, y)` or `(x, y, sample_weight)`, each a NumPy array or a dict /
  list of arrays with one row per example. The trainer shuffles them each epoch
  from `seed`, cuts global batches, splits each global batch into contiguous
  per-replica slices and gives every worker only its own slices (see
  `trainer/feed.py` for CPUs, `trainer/arrays.py` for accelerators). The global
  order of examples therefore depends on the seed alone, never on the number of
  replicas or workers, and the last partial batch is kept, not padded.
* A `tf.data.Dataset` of single examples (unbatched). The trainer batches it
  with the global batch size and distributes it with an explicit auto-shard
  policy. It is used in the order it yields: shuffle it yourself.
* A function `input_context -> tf.data.Dataset` (per-worker pipelines). It must
  shard and batch itself, with `input_context.get_per_replica_batch_size`.

`iterator_factory` turns an input into what the step functions read, and
`sharding` says in words how it is split, for the plan.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import reprlib
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from trainer import arrays
from trainer import feed as feed_lib
from trainer.cluster import strategy_cluster_info

DatasetFn = Callable[[tf.distribute.InputContext], tf.data.Dataset]


@dataclasses.dataclass(frozen=True)
class ArrayInput:
    """In-memory arrays: a nested structure with `num_examples` rows per leaf."""

    arrays: Any
    num_examples: int
    host: Any = dataclasses.field(default=None, compare=False, repr=False)  # see `host_copy`


@dataclasses.dataclass(frozen=True)
class DatasetInput:
    """An unbatched `tf.data.Dataset`; the trainer batches it."""

    dataset: tf.data.Dataset


@dataclasses.dataclass(frozen=True)
class FunctionInput:
    """A per-worker dataset function; it batches and shards itself."""

    fn: DatasetFn


Input = ArrayInput | DatasetInput | FunctionInput


def as_input(data: Any, *, arg: str, with_targets: bool = True) -> Input:
    """Validates `data` and wraps it as one of the three input kinds.

    Args:
      data: what the user passed.
      arg: the argument name, for error messages.
      with_targets: True for fit/evaluate (`(x, y[, sample_weight])`), False for
        predict (`x` alone).
    """
    if isinstance(data, tf.data.Dataset):
        return _checked_dataset(data, arg)
    if callable(data) and not isinstance(data, (np.ndarray, dict, list, tuple)):
        return FunctionInput(data)
    if with_targets:
        if not isinstance(data, (tuple, list)) or len(data) not in (2, 3):
            raise TypeError(
                f"`{arg}` must be (x, y), (x, y, sample_weight), a tf.data.Dataset or a "
                f"function input_context -> Dataset. Received: {arg} of type "
                f"{type(data).__name__}. Pass a tuple of NumPy arrays, e.g. {arg}=(x, y)."
            )
        data = tuple(data[:2]) if len(data) == 3 and data[2] is None else tuple(data)
        for name, part in zip(("x", "y", "sample_weight"), data):
            _reject_nested_lists(part, arg, name)
    else:
        _reject_nested_lists(data, arg, arg)
    arrays = tf.nest.map_structure(_as_array, data)
    return ArrayInput(arrays, _common_length(arrays, arg))


def subject(arg: str, name: str) -> str:
    """How an error names part of an argument: "`data` x['a']", or "`x`['a']" for predict's x."""
    return f"`{arg}`{name[len(arg):]}" if name.startswith(arg) else f"`{arg}` {name}"


def _reject_nested_lists(part: Any, arg: str, name: str) -> None:
    """A list of numbers (or of lists of numbers) is data, not one input per element as Keras reads lists."""
    if isinstance(part, dict):
        for key, value in part.items():
            _reject_nested_lists(value, arg, f"{name}[{key!r}]")
    elif isinstance(part, (list, tuple)) and part and any(
            isinstance(leaf, (numbers.Number, str)) for leaf in tf.nest.flatten(part)):
        raise TypeError(
            f"{subject(arg, name)} must be a NumPy array (or a list or dict of arrays, one per model input). Received: "
            f"{name} as a Python {type(part).__name__} of {len(part)} rows, starting {reprlib.repr(part[0])}. "
            "Convert it with np.asarray(...); rows of different lengths need padding first "
            "(keras.utils.pad_sequences)."
        )


def _as_array(value: Any) -> np.ndarray:
    # float64 would double memory and be cast by every layer anyway.
    array = np.asarray(value)
    return array.astype(np.float32) if array.dtype == np.float64 else array


def _common_length(arrays: Any, arg: str) -> int:
    leaves = tf.nest.flatten(arrays)
    lengths = [len(a) if a.ndim else -1 for a in leaves]
    if any(n < 0 for n in lengths):
        raise ValueError(
            f"Every array in `{arg}` needs a leading example dimension. Received: {arg} with "
            f"shapes {[a.shape for a in leaves][:8]}. Pass arrays with one row per example."
        )
    if len(set(lengths)) > 1:
        raise ValueError(
            f"All arrays in `{arg}` must have the same number of examples (rows). "
            f"Received: lengths {lengths} (x, y, then sample_weight). "
            "Make x, y and sample_weight the same length."
        )
    if lengths[0] == 0:
        raise ValueError(f"`{arg}` must hold at least one example. Received: {arg} with 0 examples. "
                         "Pass arrays with at least one row.")
    return lengths[0]


def _checked_dataset(dataset: tf.data.Dataset, arg: str) -> DatasetInput:
    if dataset.cardinality() == 0:
        raise ValueError(f"`{arg}` must hold at least one example. Received: {arg}, an empty tf.data.Dataset "
                         "(cardinality 0). Pass a dataset with examples (check any .take/.filter/.skip).")
    shapes = [s.shape for s in tf.nest.flatten(dataset.element_spec)]
    if shapes and all(s.rank and s[0] is None for s in shapes):
        raise ValueError(
            f"`{arg}` looks batched; it must yield one example per element. Received: {arg} with element "
            f"shapes {[str(s) for s in shapes]} (every leading dimension unknown). The trainer batches "
            f"datasets itself with the global batch size: pass {arg}.unbatch(), or drop .batch()."
        )
    return DatasetInput(dataset)


def feature_signature(inp: Input) -> Any:
    """Structure of (x, y[, w]) with per-example shapes, for comparing two inputs."""
    if isinstance(inp, ArrayInput):
        return tf.nest.map_structure(lambda a: tuple(a.shape[1:]), inp.arrays)
    if isinstance(inp, DatasetInput):
        spec = inp.dataset.element_spec
        if any(s.shape.rank is None for s in tf.nest.flatten(spec)):
            return None  # unknown; checks.check_data refuses it
        return tf.nest.map_structure(lambda s: tuple(s.shape), spec)
    return None


def num_examples(inp: Input) -> int | None:
    """Examples in one pass over `inp`, or None when unknown."""
    if isinstance(inp, ArrayInput):
        return inp.num_examples
    if isinstance(inp, DatasetInput):
        n = int(inp.dataset.cardinality())
        return n if n >= 0 else None
    return None


def num_steps(inp: Input, global_batch_size: int) -> int | None:
    """Global steps in one pass over `inp`, or None when unknown."""
    n = num_examples(inp)
    return None if n is None else -(-n // global_batch_size)


def shard_policy(dataset: tf.data.Dataset, num_workers: int) -> tuple[Any, str]:
    """The auto-shard policy for a user dataset, and the reason, for the plan."""
    policy_enum = tf.data.experimental.AutoShardPolicy
    chosen = dataset.options().experimental_distribute.auto_shard_policy
    if chosen != policy_enum.AUTO:
        return chosen, "set on the dataset by the user"
    if num_workers == 1:
        return policy_enum.OFF, "one worker reads everything; nothing to shard"
    return policy_enum.DATA, "every worker reads the data and keeps its share of each batch (exact for any source)"


def sharding(inp: Input, num_workers: int, *, parameter_server: bool = False) -> tuple[str, str]:
    """(policy, reason) of how `inp` is split across workers, for the plan."""
    if parameter_server:
        return "per worker", "each worker reads its own shard, shuffled and repeated; steps go to free workers"
    if isinstance(inp, ArrayInput):
        return "OFF", "the trainer splits each global batch into per-replica slices; each worker gathers only its own"
    if isinstance(inp, FunctionInput):
        return "per worker", "your dataset function shards by its input_context"
    policy, reason = shard_policy(inp.dataset, num_workers)
    return policy.name, reason


def iterator_factory(strategy: tf.distribute.Strategy, global_batch_size: int, *, shuffle: bool,
                     seed: int) -> Callable[..., Any]:
    """`(inp, epoch=None, start_step=0, until=None)` -> what step calls read from.

    That is an `ArrayFeed` for arrays on CPU replicas; for a dataset on CPU
    replicas, `GlobalBatches`, which the steps split among the replicas (on
    several workers, unless the dataset sets its own auto-shard policy: every
    worker then reads all of it, as the DATA policy would have it do); else a
    distributed iterator. With `epoch`,
    arrays are shuffled per epoch (from `seed`) and one pass covers epochs
    `epoch` to `until` (exclusive; one epoch by default); without it, they are
    read once in input order. `start_step` skips global steps at the start of
    the pass (a resumed run).
    """
    num_workers = strategy_cluster_info(strategy).num_workers
    # A dataset read from its start is distributed once and iterated again each epoch:
    # distributing it rewrites its graph, 10-11 ms a time for the benchmark's pipeline.
    distributed: list[tuple[DatasetInput, Any]] = []

    def make_iterator(inp: Input, epoch: int | None = None, start_step: int = 0, until: int | None = None):
        order: arrays.OrderFn | None = None
        epochs = range(1)
        if isinstance(inp, ArrayInput) and epoch is not None:
            order = functools.partial(_epoch_order, inp.num_examples, shuffle, seed)
            epochs = range(epoch, until or epoch + 1)
        if isinstance(inp, ArrayInput) and feed_lib.supports(strategy):
            return feed_lib.ArrayFeed(inp, order or (lambda _: np.arange(inp.num_examples)),
                                      global_batch_size=global_batch_size,
                                      num_replicas=strategy.num_replicas_in_sync, epochs=epochs, start_step=start_step)
        if isinstance(inp, DatasetInput) and feed_lib.supports(strategy) and _whole_on_every_worker(inp, num_workers):
            return feed_lib.GlobalBatches(batched(inp, global_batch_size, start_step))  # the steps split each batch
        reusable = isinstance(inp, DatasetInput) and start_step == 0
        for known, dataset in distributed if reusable else ():
            if known is inp:
                return iter(dataset)
        dataset = distribute(strategy, inp, global_batch_size=global_batch_size, num_workers=num_workers,
                             order=order, epochs=epochs, start_step=start_step)
        if reusable:
            distributed.append((inp, dataset))
        return iter(dataset)

    return make_iterator


def _whole_on_every_worker(inp: DatasetInput, num_workers: int) -> bool:
    """Whether every worker reads all of `inp` and keeps its share: one worker, or no policy set by the user."""
    chosen = inp.dataset.options().experimental_distribute.auto_shard_policy
    return num_workers == 1 or chosen == tf.data.experimental.AutoShardPolicy.AUTO


def _epoch_order(num_examples: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    return arrays.epoch_order(num_examples, shuffle=shuffle, seed=seed, epoch=epoch)


def distribute(
    strategy: tf.distribute.Strategy,
    inp: Input,
    *,
    global_batch_size: int,
    num_workers: int,
    order: arrays.OrderFn | None = None,
    epochs: range = range(1),
    start_step: int = 0,
):
    """Returns a distributed dataset for one pass over `inp`.

    Args:
      order: for arrays, epoch -> the order of examples (input order by default).
      epochs: for arrays, the epochs one pass covers.
      start_step: global steps to skip at the start of the pass.
    """
    if isinstance(inp, ArrayInput):
        order = order or (lambda epoch: np.arange(inp.num_examples))
        fn = arrays.array_dataset_fn(inp, order, global_batch_size, epochs, start_step)
        return strategy.distribute_datasets_from_function(fn)
    if isinstance(inp, FunctionInput):
        return strategy.distribute_datasets_from_function(inp.fn)
    policy, _ = shard_policy(inp.dataset, num_workers)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return strategy.experimental_distribute_dataset(batched(inp, global_batch_size, start_step).with_options(options))


def batched(inp: DatasetInput, global_batch_size: int, start_step: int = 0) -> tf.data.Dataset:
    """`inp`'s dataset in global batches (the last one partial), from global step `start_step` on."""
    ds = inp.dataset.skip(start_step * global_batch_size) if start_step else inp.dataset
    return ds.batch(global_batch_size).prefetch(tf.data.AUTOTUNE)


def sample_batch(inp: Input, n: int = 2) -> Any:
    """A few examples, eagerly, to build the model and resolve metrics."""
    if isinstance(inp, ArrayInput):
        return tf.nest.map_structure(lambda a: tf.convert_to_tensor(a[:n]), inp.arrays)
    if isinstance(inp, DatasetInput):
        return next(iter(inp.dataset.batch(n)))
    ds = inp.fn(tf.distribute.InputContext())
    return next(iter(ds))
