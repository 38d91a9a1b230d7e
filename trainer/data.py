"""User inputs -> sharded, distributed batches.

Each form of input is one source kind, validated once at the boundary
(`as_input`, then `checks.check_data`), with one contract: how it is batched,
split across workers and replicas, restarted each epoch and resumed mid-epoch
(docs/input_forms.md has the table of form x strategy).

* `ArrayInput`: `(x, y[, sample_weight])` NumPy arrays (or dicts / lists of
  arrays), also given Keras's way as `fit(model, x, y, sample_weight=...)`. The
  trainer shuffles them each epoch from `seed`, cuts global batches, splits each
  into contiguous per-replica slices and gives every worker only its own slices
  (`trainer/feed.py` on CPUs, `trainer/arrays.py` on accelerators). The global
  order depends on the seed alone, and the last partial batch is kept.
* `DatasetInput`: a `tf.data.Dataset` of single examples. The trainer batches
  it with the global batch size, in the order it yields.
* `BatchedInput`: batches the user made, each one global step as under
  `model.fit`: a batched `tf.data.Dataset` (`.batch(64)`, `drop_remainder`,
  `.prefetch`, ...), a Python generator of batches, or a
  `keras.utils.PyDataset` (read through Keras's own adapters, so its workers,
  queue and epoch hooks behave as under `model.fit`). Every worker reads every
  batch and keeps its replicas' rows.
* `FunctionInput`: a function `input_context -> tf.data.Dataset` (per-worker
  pipelines). It must shard and batch itself.

`iterator_factory` turns an input into what the step functions read, and
`sharding` says in words how it is split, for the plan.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import reprlib
import types
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from trainer import _compat, arrays
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
class BatchedInput:
    """Batches the user made: a batched tf.data.Dataset, a generator or a PyDataset; each is one global step.

    Attributes:
      dataset: the global batches, as a tf.data.Dataset.
      form: "batched dataset", "generator" or "PyDataset", for the plan and messages.
      batch_size: rows in a full batch (the global batch), when known without reading.
      num_batches: batches in one pass, when known.
      example_spec: per-example `tf.TensorSpec`s of an element, for checks against the model.
      adapter: Keras's adapter of a generator or PyDataset (its epoch hooks start and stop
        a PyDataset's workers), else None.
      first: a batch to build the model on, when one could be read without side effects.
    """

    dataset: tf.data.Dataset
    form: str
    batch_size: int | None
    num_batches: int | None
    example_spec: Any
    adapter: Any = dataclasses.field(default=None, compare=False, repr=False)
    first: Any = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class FunctionInput:
    """A per-worker dataset function; it batches and shards itself."""

    fn: DatasetFn


Input = ArrayInput | DatasetInput | BatchedInput | FunctionInput


def epoch_begin(inp: Input) -> None:
    """Starts an epoch of `inp`: a PyDataset's workers and its `on_epoch_begin`, as `model.fit` does."""
    if isinstance(inp, BatchedInput) and inp.adapter is not None:
        inp.adapter.on_epoch_begin()


def epoch_end(inp: Input, *, read_all: bool) -> list:
    """Ends an epoch of `inp` as `model.fit` does; returns iterators for the caller to release.

    Stops a PyDataset's workers and calls its `on_epoch_end`. After reading all
    of a batched dataset of known length, Keras's epoch iterator starts a new
    iterator on it (and drops it when the next epoch starts another): that
    advances a `.shuffle(reshuffle_each_iteration=True)` in the dataset by one
    order, so every epoch of `model.fit` skips one. The trainer does the same,
    so that the epochs read the examples in `model.fit`'s order.
    """
    if isinstance(inp, BatchedInput) and inp.adapter is not None:
        inp.adapter.on_epoch_end()
    if read_all and isinstance(inp, BatchedInput) and inp.adapter is None and inp.num_batches:
        return [iter(inp.dataset)]
    return []


def as_input(x: Any, y: Any = None, sample_weight: Any = None, *, arg: str, with_targets: bool = True,
             class_weight: Any = None, shuffle: bool = False) -> Input:
    """Validates the user's data and wraps it as one of the input kinds.

    Args:
      x: what the user passed first: `(x, y[, sample_weight])` arrays, features
        (with `y` given), a dataset, generator, PyDataset or dataset function.
      y, sample_weight: the targets and weights given Keras's way, for arrays.
      arg: the argument name, for error messages.
      with_targets: True for fit/evaluate, False for predict (`x` alone).
      class_weight: {class: weight}, folded into the sample weights as Keras does.
      shuffle: for a PyDataset, shuffle its batch order each epoch (as Keras does).
    """
    form = _form(x)
    if form != "arrays" and (y is not None or sample_weight is not None):
        given = "y" if y is not None else "sample_weight"
        raise ValueError(
            f"`{given}` must be None when `{arg}` is a {form}: the targets and weights come from its elements. "
            f"Received: {given} of type {type(y if y is not None else sample_weight).__name__}. "
            f"Make the {form} yield (x, y) or (x, y, sample_weight), and drop {given}=."
        )
    if form in ("generator", "PyDataset"):
        return _adapted(x, form, arg, class_weight=class_weight, shuffle=shuffle)
    if form == "tf.data.Dataset":
        return _checked_dataset(x, arg, class_weight)
    if form == "function":
        _no_class_weight(class_weight, "a dataset function", "weights in the dataset it returns")
        return FunctionInput(x)
    if y is not None or sample_weight is not None:
        data = (x, y) if sample_weight is None else (x, y, sample_weight)
    elif with_targets:
        if not isinstance(x, (tuple, list)) or len(x) not in (2, 3):
            raise TypeError(
                f"`{arg}` must be (x, y), (x, y, sample_weight), a tf.data.Dataset, a generator, a "
                f"keras.utils.PyDataset or a function input_context -> Dataset. Received: {arg} of type "
                f"{type(x).__name__}. Pass the targets too: fit(model, x, y), or {arg}=(x, y)."
            )
        data = tuple(x[:2]) if len(x) == 3 and x[2] is None else tuple(x)
    else:
        data = x
    if with_targets:
        for name, part in zip(("x", "y", "sample_weight"), data):
            _reject_nested_lists(part, arg, name)
    else:
        _reject_nested_lists(data, arg, arg)
    arrays = tf.nest.map_structure(_as_array, data)
    if with_targets:
        arrays = (tf.nest.map_structure(_text_as_bytes, arrays[0]), *arrays[1:])
    else:
        arrays = tf.nest.map_structure(_text_as_bytes, arrays)
    inp = ArrayInput(arrays, _common_length(arrays, arg))
    return _class_weighted(inp, class_weight, arg) if class_weight is not None else inp


def check_workers(inp: Input, num_workers: int, *, parameter_server: bool, arg: str) -> None:
    """Refuses the Python-fed forms where they can't be exact: on parameter-server workers, and on several workers.

    Under MultiWorkerMirroredStrategy every worker reads every batch and keeps
    its replicas' rows, so all must read the same batches: a PyDataset does (it
    is indexed), unless Keras shuffles its batch order with each process's own
    Python random state; a generator may not (each process runs its own).
    """
    if not isinstance(inp, BatchedInput) or inp.adapter is None:
        return
    if parameter_server:
        raise ValueError(
            f"Parameter-server training runs the input pipeline on the workers, which can't call back into this "
            f"process's Python: a {inp.form} can't feed them. Received: `{arg}` as a {inp.form}. Pass a "
            "tf.data.Dataset (from files, or from_tensor_slices), or a function input_context -> Dataset."
        )
    if num_workers > 1 and inp.form == "generator":
        raise ValueError(
            f"A generator can't feed {num_workers} workers exactly: each worker's process runs its own copy, and "
            f"nothing makes them yield the same batches. Received: `{arg}` as a generator. Wrap the data in a "
            "keras.utils.PyDataset (indexed batches), or pass a tf.data.Dataset."
        )
    if num_workers > 1 and getattr(inp.adapter, "shuffle", False):
        raise ValueError(
            f"A shuffled PyDataset can't feed {num_workers} workers exactly: Keras shuffles its batch order with "
            f"each process's own Python random state, so the workers would read different batches. Received: "
            f"`{arg}` as a PyDataset with shuffle=True (fit's default). Pass shuffle=False, and shuffle in the "
            "PyDataset's on_epoch_end with a generator seeded the same on every worker."
        )


def fit_inputs(x: Any, y: Any, sample_weight: Any, *, arg: str, class_weight: Any, shuffle: bool,
               validation_split: float) -> tuple[Input, ArrayInput | None]:
    """fit's training input, and the validation arrays `validation_split` takes from it (None without).

    The split comes first, as in Keras: the class weights weigh the training rows only.
    """
    if not validation_split:
        return as_input(x, y, sample_weight, arg=arg, class_weight=class_weight, shuffle=shuffle), None
    inp = as_input(x, y, sample_weight, arg=arg, shuffle=shuffle)
    train, val = split_validation(inp, validation_split, arg)
    return (_class_weighted(train, class_weight, arg) if class_weight is not None else train), val


def _keras_x(*element):
    """The features of a dataset element, as Keras's predict reads them: x of (x,), (x, y) or (x, y, w)."""
    if len(element) == 1:
        element = element[0]
    return element[0] if isinstance(element, (tuple, list)) and 1 <= len(element) <= 3 else element


def features(inp: Input, model: Any) -> Input:
    """What predict feeds the model from `inp`: the features of `(x, y)` elements, as Keras's predict reads them.

    An element that is a tuple of as many tensors as `model` has inputs is
    taken whole, as the features of a multi-input model (Keras would read its
    first tensor as x and the second as y).
    """
    if not isinstance(inp, (DatasetInput, BatchedInput)):
        return inp
    spec = example_spec(inp)
    inputs = getattr(model, "inputs", None) if isinstance(model, keras.Model) and model.built else None
    if isinstance(spec, tuple) and inputs is not None and len(spec) == len(inputs) > 1:
        return inp
    return _features_only(inp)


def _features_only(inp: DatasetInput | BatchedInput) -> DatasetInput | BatchedInput:
    dataset = inp.dataset.map(_keras_x)
    if isinstance(inp, DatasetInput):
        return DatasetInput(dataset)
    first = None if inp.first is None else _keras_x(inp.first)
    return dataclasses.replace(inp, dataset=dataset, example_spec=_keras_x(inp.example_spec), first=first)


def _form(x: Any) -> str:
    if isinstance(x, tf.data.Dataset):
        return "tf.data.Dataset"
    if isinstance(x, keras.utils.PyDataset):
        return "PyDataset"
    if isinstance(x, types.GeneratorType) or (hasattr(x, "__next__") and hasattr(x, "__iter__")):
        return "generator"
    if callable(x) and not isinstance(x, (np.ndarray, dict, list, tuple)):
        return "function"
    return "arrays"


def split_validation(inp: Input, validation_split: float, arg: str) -> tuple[ArrayInput, ArrayInput]:
    """(train, validation): the last `validation_split` of the arrays' rows, before any shuffle, as Keras splits."""
    if not isinstance(inp, ArrayInput):
        raise ValueError(
            f"`validation_split` needs arrays, which can be split by rows. Received: validation_split="
            f"{validation_split} with `{arg}` as a {_describe_form(inp)}. Pass validation_data= instead."
        )
    split_at = int(math.floor(inp.num_examples * (1.0 - validation_split)))
    if split_at == 0 or split_at == inp.num_examples:
        raise ValueError(
            f"`validation_split` leaves no examples on one side: {inp.num_examples} examples split at "
            f"{split_at}. Received: validation_split={validation_split}. Pass a fraction that leaves at least one "
            "example for training and one for validation."
        )
    train = tf.nest.map_structure(lambda a: a[:split_at], inp.arrays)
    val = tf.nest.map_structure(lambda a: a[split_at:], inp.arrays)
    return ArrayInput(train, split_at), ArrayInput(val, inp.num_examples - split_at)


def _describe_form(inp: Input) -> str:
    if isinstance(inp, BatchedInput):
        return inp.form
    return {DatasetInput: "tf.data.Dataset", FunctionInput: "dataset function"}.get(type(inp), "arrays")


def _no_class_weight(class_weight: Any, what: str, fix: str) -> None:
    if class_weight is not None:
        raise ValueError(
            f"`class_weight` can't be applied to {what}, whose batches the trainer does not see until they run. "
            f"Received: class_weight={reprlib.repr(class_weight)}. Put {fix} instead."
        )


def check_class_weight(class_weight: Any) -> None:
    """A mapping {class index: weight}, as `model.fit` takes it."""
    if class_weight is None:
        return
    if not isinstance(class_weight, dict) or not all(
            isinstance(k, (numbers.Integral, np.integer)) and isinstance(v, (numbers.Real, np.number))
            for k, v in class_weight.items()):
        raise TypeError(
            f"`class_weight` must be a dict mapping class indices (int) to weights (float). Received: "
            f"class_weight={reprlib.repr(class_weight)} of type {type(class_weight).__name__}. Pass e.g. "
            "class_weight={0: 1.0, 1: 5.0}; classes left out weigh 1.0."
        )


def _class_indices(y: Any) -> Any:
    """Keras's reading of targets as classes: the argmax of one-hot rows, else the rounded label."""
    if len(y.shape) > 1 and y.shape[-1] != 1:
        return np.argmax(y, axis=-1) if isinstance(y, np.ndarray) else tf.argmax(y, axis=-1)
    if isinstance(y, np.ndarray):
        return np.round(y.reshape(len(y))).astype(np.int64)
    return tf.cast(tf.round(tf.reshape(y, [-1])), tf.int64)


def _class_weighted(inp: ArrayInput, class_weight: dict, arg: str) -> ArrayInput:
    x, y, *weights = inp.arrays
    _single_target(y, weights, class_weight)
    classes = _class_indices(y)
    weights = np.array([class_weight.get(int(c), 1.0) for c in range(int(classes.max()) + 1)], np.float32)
    return ArrayInput((x, y, weights[classes]), inp.num_examples)


def _single_target(y: Any, weights: list, class_weight: Any) -> None:
    if weights:
        raise ValueError(
            "`class_weight` and `sample_weight` can't both be given (Keras refuses them together too). "
            f"Received: class_weight={reprlib.repr(class_weight)} and a sample_weight. Multiply the class "
            "weights into sample_weight yourself, and drop class_weight."
        )
    if isinstance(y, (dict, list, tuple)):
        raise ValueError(
            "`class_weight` needs a model with a single output (as in Keras). Received: targets with "
            f"{len(y)} outputs. Pass per-output sample_weight instead."
        )


def _class_weight_fn(class_weight: dict, batched: bool) -> Callable:
    """A dataset map that appends Keras's class weights to (x, y) elements."""
    size = max(class_weight) + 1
    table = tf.constant([class_weight.get(c, 1.0) for c in range(size)], tf.float32)

    def add_weights(x, y):
        classes = _class_indices(y if batched else tf.expand_dims(y, 0))
        weights = tf.gather(table, tf.clip_by_value(classes, 0, size - 1))
        weights = tf.where(classes < size, weights, 1.0)
        return x, y, weights if batched else weights[0]

    return add_weights


def _adapted(x: Any, form: str, arg: str, *, class_weight: Any, shuffle: bool) -> BatchedInput:
    """A generator or PyDataset through Keras's adapter, which peeks at its first batches (and keeps them)."""
    if form == "generator":
        _no_class_weight(class_weight, "a generator (Keras refuses it too)", "the weights in the batches it yields")
    try:
        adapter = _compat.keras_adapter(x, class_weight=class_weight, shuffle=shuffle)
        dataset = adapter.get_tf_dataset()
    except ValueError as err:
        raise ValueError(
            f"`{arg}`, a {form}, must yield batches as (x, y) or (x, y, sample_weight) tuples of arrays. "
            f"Keras could not read it: {err} Yield tuples of NumPy arrays with one row per example."
        ) from None
    first = _compat.first_batch(adapter)
    leading = [tf.TensorShape(np.shape(t))[:1] for t in tf.nest.flatten(first)]
    batch_size = int(leading[0][0]) if leading and leading[0].rank else None
    return BatchedInput(dataset, form, batch_size, adapter.num_batches, _per_example(dataset.element_spec),
                        adapter=adapter, first=first)


def _per_example(spec: Any) -> Any:
    return tf.nest.map_structure(
        lambda s: tf.TensorSpec(s.shape[1:], s.dtype) if s.shape.rank else s, spec)


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


def _text_as_bytes(array: np.ndarray) -> np.ndarray:
    """Features that are text (str arrays, or object arrays of str), as UTF-8 bytes: TensorFlow's tf.string."""
    if array.dtype.kind == "U" or (array.dtype == object and array.size and all(
            isinstance(v, (str, bytes)) for v in array.flat)):
        encode = np.vectorize(lambda v: v.encode("utf-8") if isinstance(v, str) else v, otypes=[object])
        return encode(array).astype(bytes)
    return array


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


def _checked_dataset(dataset: tf.data.Dataset, arg: str, class_weight: Any = None) -> DatasetInput | BatchedInput:
    """An unbatched dataset, which the trainer batches, or a batched one, whose batches are the global batches."""
    if dataset.cardinality() == 0:
        raise ValueError(f"`{arg}` must hold at least one example. Received: {arg}, an empty tf.data.Dataset "
                         "(cardinality 0). Pass a dataset with examples (check any .take/.filter/.skip).")
    batched, batch_size = _compat.declared_batch_size(dataset)
    shapes = [s.shape for s in tf.nest.flatten(dataset.element_spec)]
    if not batched and shapes and all(s.rank and s[0] is None for s in shapes):
        batched = True  # every leading dimension unknown: batches from a source this walk can't see into
    if class_weight is not None:
        spec = dataset.element_spec
        if isinstance(spec, tuple) and len(spec) == 3:
            _single_target(spec[1], [spec[2]], class_weight)
        if isinstance(spec, tuple) and len(spec) == 2:
            _single_target(spec[1], [], class_weight)
            dataset = dataset.map(_class_weight_fn(class_weight, batched))
    if not batched:
        return DatasetInput(dataset)
    cardinality = int(dataset.cardinality())
    return BatchedInput(dataset, "batched dataset", batch_size, cardinality if cardinality >= 0 else None,
                        _per_example(dataset.element_spec))


def feature_signature(inp: Input) -> Any:
    """Structure of (x, y[, w]) with per-example shapes, for comparing two inputs."""
    if isinstance(inp, ArrayInput):
        return tf.nest.map_structure(lambda a: tuple(a.shape[1:]), inp.arrays)
    if isinstance(inp, (DatasetInput, BatchedInput)):
        spec = example_spec(inp)
        if any(s.shape.rank is None for s in tf.nest.flatten(spec)):
            return None  # unknown; checks.check_data refuses it
        return tf.nest.map_structure(lambda s: tuple(s.shape), spec)
    return None


def example_spec(inp: DatasetInput | BatchedInput) -> Any:
    """The `tf.TensorSpec`s of one example of a dataset's elements."""
    return inp.example_spec if isinstance(inp, BatchedInput) else inp.dataset.element_spec


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
    if isinstance(inp, BatchedInput):
        return inp.num_batches
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
    if isinstance(inp, BatchedInput) and inp.form != "batched dataset":
        return ("OFF", f"one worker reads the {inp.form}" if num_workers == 1 else
                f"every worker reads every batch of the {inp.form} and keeps its replicas' rows")
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
        datasets = (DatasetInput, BatchedInput)
        if isinstance(inp, datasets) and feed_lib.supports(strategy) and _whole_on_every_worker(inp, num_workers):
            return feed_lib.GlobalBatches(global_batches(inp, global_batch_size, start_step))  # the steps split them
        reusable = isinstance(inp, datasets) and start_step == 0
        for known, dataset in distributed if reusable else ():
            if known is inp:
                return iter(dataset)
        dataset = distribute(strategy, inp, global_batch_size=global_batch_size, num_workers=num_workers,
                             order=order, epochs=epochs, start_step=start_step)
        if reusable:
            distributed.append((inp, dataset))
        return iter(dataset)

    return make_iterator


def _whole_on_every_worker(inp: DatasetInput | BatchedInput, num_workers: int) -> bool:
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
    return strategy.experimental_distribute_dataset(
        global_batches(inp, global_batch_size, start_step).with_options(options))


def global_batches(inp: DatasetInput | BatchedInput, global_batch_size: int, start_step: int = 0) -> tf.data.Dataset:
    """`inp`'s dataset in global batches (the last one partial), from global step `start_step` on.

    A batched input's own batches are the global batches; an unbatched dataset
    is batched here with `global_batch_size`.
    """
    if isinstance(inp, BatchedInput):
        return inp.dataset.skip(start_step) if start_step else inp.dataset
    ds = inp.dataset.skip(start_step * global_batch_size) if start_step else inp.dataset
    return ds.batch(global_batch_size).prefetch(tf.data.AUTOTUNE)


def sample_batch(inp: Input, n: int = 2) -> Any:
    """A few examples, eagerly, to build the model and resolve metrics."""
    if isinstance(inp, ArrayInput):
        return tf.nest.map_structure(lambda a: tf.convert_to_tensor(a[:n]), inp.arrays)
    if isinstance(inp, DatasetInput):
        return next(iter(inp.dataset.batch(n)))
    if isinstance(inp, BatchedInput):
        return inp.first if inp.first is not None else _placeholder_batch(inp, n)
    ds = inp.fn(tf.distribute.InputContext())
    return next(iter(ds))


def _placeholder_batch(inp: BatchedInput, n: int) -> Any:
    """`n` examples of zeros (empty strings) shaped as `inp`'s elements, or its first batch if a shape is open.

    Reading a batch would start an iterator on the user's dataset, and a
    `.shuffle(reshuffle_each_iteration=True)` in it would then give every epoch
    the order of the next one: `model.fit` reads none before training.
    """
    specs = tf.nest.flatten(inp.example_spec)
    if any(not s.shape.is_fully_defined() for s in specs):
        return next(iter(inp.dataset))

    def zeros(spec):
        shape = [n, *spec.shape]
        return tf.fill(shape, "") if spec.dtype == tf.string else tf.zeros(shape, spec.dtype)

    return tf.nest.map_structure(zeros, inp.example_spec)


def batch_size_of(inp: BatchedInput) -> int:
    """The rows in a full batch of `inp` (the global batch): declared, or read from its first batch."""
    if inp.batch_size is not None:
        return inp.batch_size
    first = inp.first if inp.first is not None else next(iter(inp.dataset))
    return int(tf.shape(tf.nest.flatten(first)[0])[0])
