"""The boundary: what the user passed to fit, evaluate or predict -> one input kind, checked.

`as_input` (and `fit_inputs`, which also cuts `validation_split`) recognises
the form (arrays given either way, a tf.data.Dataset batched or not, a
generator, a PyDataset, or a dataset function), refuses what can't be read
exactly with a message that names the argument and the fix, folds in
`class_weight` as Keras does, and returns one of the kinds of
`trainer/data/inputs.py`, which carry the rest of the contract. `fit_inputs`,
`evaluate_input` and `predict_input` then check what they made: for the
workers (`check_workers` refuses the Python-fed forms where several processes
can't read them alike), and on its own (`check_data` in `data/checks.py`). The checks
against the model come later (`checks`), once it is known.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import reprlib
import types
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer import _compat
from trainer.data import class_weights
from trainer.data import arrays as arrays_lib
from trainer.data.arrays import as_float32
from trainer.data.checks import check_data, subject
from trainer.data.feed import spec_rank
from trainer.data.inputs import ArrayInput, BatchedInput, DatasetInput, FunctionInput, Input
from trainer.user_line import user_stacklevel


def as_input(x: Any, y: Any = None, sample_weight: Any = None, *, arg: str, with_targets: bool = True,
             class_weight: Any = None, shuffle: bool = False, warn: bool = False) -> Input:
    """Validates the user's data and wraps it as one of the input kinds.

    Args:
      x: what the user passed first: `(x, y[, sample_weight])` arrays, features
        (with `y` given), a dataset, generator, PyDataset or dataset function.
      y, sample_weight: the targets and weights given Keras's way, for arrays.
      arg: the argument name, for error messages.
      with_targets: True for fit/evaluate, False for predict (`x` alone).
      class_weight: {class: weight}, folded into the sample weights as Keras does.
      shuffle: for a PyDataset, shuffle its batch order each epoch (as Keras does).
      warn: give the warnings model.fit's data adapters give for `x`.
    """
    form = _form(x)
    if form != "arrays" and (y is not None or sample_weight is not None):
        given = "y" if y is not None else "sample_weight"
        raise ValueError(
            f"`{given}` must be None when `{arg}` is a {form}: the targets and weights come from its elements. "
            f"Received: {given} of type {type(y if y is not None else sample_weight).__name__}. "
            f"Make the {form} yield (x, y) or (x, y, sample_weight), and drop {given}=."
        )
    if form in ("generator", "PyDataset", "grain dataset", "tf.data.Dataset"):
        view = _keras_view(x, form, arg, class_weight=class_weight, shuffle=shuffle, warn=warn)
        return _checked_dataset(view, arg, class_weight) if form == "tf.data.Dataset" else _adapted(view, form)
    if form == "function":
        class_weights.refused(class_weight, "a dataset function", "weights in the dataset it returns")
        return FunctionInput(x)
    if form == "distributed dataset":
        return _distributed(x, arg, class_weight=class_weight, warn=warn)
    if y is not None or sample_weight is not None:
        data = (x, y) if sample_weight is None else (x, y, sample_weight)
    elif with_targets and isinstance(x, (tuple, list)) and len(x) in (2, 3):
        data = tuple(x[:2]) if len(x) == 3 and x[2] is None else tuple(x)
    elif with_targets:
        if x is None or isinstance(x, (str, bytes, numbers.Number)):
            raise TypeError(
                f"`{arg}` must be arrays (x alone, or (x, y[, sample_weight])), a tf.data.Dataset, a generator, a "
                f"keras.utils.PyDataset or a function input_context -> Dataset. Received: {arg}={reprlib.repr(x)} "
                f"of type {type(x).__name__}. Pass the data: fit(model, x, y), or {arg}=(x, y)."
            )
        # Features alone, as Keras packs them (`pack_x_y_sample_weight`): an array or a dict stays bare, so that
        # a model's own train_step gets x itself; a sequence is wrapped. `checks` refuses them to a model that
        # needs y.
        data = (x,) if isinstance(x, (tuple, list)) else x
    else:
        data = x
    if with_targets and isinstance(data, tuple):
        for name, part in zip(("x", "y", "sample_weight"), data):
            _reject_nested_lists(part, arg, name)
        arrays = tf.nest.map_structure(_as_array, data)
        arrays = (tf.nest.map_structure(_text_as_bytes, arrays[0]), *arrays[1:])
    else:
        _reject_nested_lists(data, arg, "x" if with_targets else arg)
        arrays = tf.nest.map_structure(_text_as_bytes, tf.nest.map_structure(_as_array, data))
    inp = ArrayInput(arrays, _common_length(arrays, arg))
    return class_weights.weighed(inp, class_weight, arg) if class_weight is not None else inp


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
               validation_split: float, validation_data: Any, steps_per_epoch: int | None, num_workers: int,
               parameter_server: bool, is_chief: bool) -> tuple[Input, Input | None]:
    """fit's training input, and what it validates on (None without): `validation_data`, or the `validation_split`.

    As in Keras, `validation_data` wins over `validation_split`, and the split
    comes first: the class weights weigh the training rows only. Both inputs
    are checked, and checked for the workers they will be read on (under
    parameter-server training only the training input goes to the workers;
    validation runs on the coordinator). The chief gives model.fit's warnings
    about `x`.
    """
    if validation_split and validation_data is None:
        train, val = split_validation(as_input(x, y, sample_weight, arg=arg, shuffle=shuffle), validation_split, arg)
        if class_weight is not None:
            train = class_weights.weighed(train, class_weight, arg)
    else:
        train = as_input(x, y, sample_weight, arg=arg, class_weight=class_weight, shuffle=shuffle, warn=is_chief)
        val = None if validation_data is None else _validation_input(validation_data, train)
    check_workers(train, num_workers, parameter_server=parameter_server, arg=arg)
    if val is not None:
        check_workers(val, 1 if parameter_server else num_workers, parameter_server=False, arg="validation_data")
    check_data(train, "data", steps_arg="steps_per_epoch", steps=steps_per_epoch)
    if val is not None:
        check_data(val, "validation_data", steps_arg=None, steps=None)
    return train, val


def evaluate_input(x: Any, y: Any, sample_weight: Any, *, arg: str, steps: int | None, num_workers: int,
                   parameter_server: bool) -> Input:
    """evaluate's input, checked, and checked for its workers."""
    inp = as_input(x, y, sample_weight, arg=arg)
    check_workers(inp, num_workers, parameter_server=parameter_server, arg=arg)
    check_data(inp, "data", steps_arg="steps", steps=steps)
    return inp


def predict_input(x: Any, model: Any, *, num_workers: int, parameter_server: bool) -> Input:
    """predict's input: the features of `x` (`features`), checked, and checked for its workers."""
    inp = features(as_input(x, arg="x", with_targets=False), model)
    check_workers(inp, num_workers, parameter_server=parameter_server, arg="x")
    check_data(inp, "x", steps_arg=None, steps=None, with_targets=False)
    return inp


def _validation_input(validation_data: Any, train: Input) -> Input:
    val = as_input(validation_data, arg="validation_data")
    train_sig, val_sig = train.signature(), val.signature()
    if train_sig is not None and val_sig is not None and train_sig[:2] != val_sig[:2]:
        raise ValueError(
            "`validation_data` must have the same structure and per-example shapes as `data`. "
            f"Received: data (x, y) = {train_sig[:2]}, validation_data (x, y) = {val_sig[:2]}. "
            "Pass validation arrays shaped like the training arrays."
        )
    return val


def _keras_x(element):
    """The features of a dataset element, as Keras's predict reads them: x of (x,), (x, y) or (x, y, w)."""
    return element[0] if isinstance(element, (tuple, list)) and 1 <= len(element) <= 3 else element


def _keras_x_mapped(*components):
    """`_keras_x` as `Dataset.map` calls it: a tuple element comes as its components, so one component is x
    whether the element was x itself or (x,) (a tuple of several inputs stays whole)."""
    return components[0] if len(components) <= 3 else components


def features(inp: Input, model: Any) -> Input:
    """What predict feeds the model from `inp`: the features of `(x, y[, sample_weight])` elements, as Keras's
    predict reads them (`unpack_x_y_sample_weight`: x is a tuple's first part, for tuples of 1 to 3).

    A tuple of more parts, which Keras refuses, is taken whole where the model
    has as many inputs: the features of a multi-input model.
    """
    if not isinstance(inp, (DatasetInput, BatchedInput)):
        return inp
    spec = inp.example_spec
    inputs = getattr(model, "inputs", None) if _compat.is_model(model) and model.built else None
    if isinstance(spec, tuple) and inputs is not None and len(spec) == len(inputs) > 3:
        return inp
    return _features_only(inp)


def _features_only(inp: DatasetInput | BatchedInput) -> DatasetInput | BatchedInput:
    dataset = inp.dataset.map(_keras_x_mapped)
    if isinstance(inp, DatasetInput):
        return DatasetInput(dataset)
    first = None if inp.first is None else _keras_x(inp.first)
    by_rows = None if inp.by_rows is None else lambda rows: inp.by_rows(rows).map(_keras_x_mapped)
    return dataclasses.replace(inp, dataset=dataset, example_spec=_keras_x(inp.example_spec), first=first,
                               by_rows=by_rows)


def batch_rows(x: Any, arg: str) -> int:
    """The rows of one batch of features given whole (`train_on_batch` and its kin): its first leaf's leading
    dimension."""
    leaves = [leaf for leaf in tf.nest.flatten(x, expand_composites=False) if leaf is not None]
    shapes = [getattr(leaf, "shape", None) for leaf in leaves]
    if not leaves or any(shape is None or len(shape) == 0 or shape[0] is None for shape in shapes):
        raise ValueError(f"`{arg}` must be one batch of features with a leading example dimension. Received: {arg} "
                         f"with shapes {[getattr(leaf, 'shape', type(leaf).__name__) for leaf in leaves][:8]}. Pass "
                         "arrays or tensors with one row per example.")
    return int(shapes[0][0])


def is_arrays(x: Any) -> bool:
    """Whether `x` is data given as arrays (which fit batches), not a dataset, generator, PyDataset or function."""
    return x is not None and _form(x) == "arrays"


def _form(x: Any) -> str:
    if isinstance(x, tf.data.Dataset):
        return "tf.data.Dataset"
    if _compat.is_distributed_dataset(x):
        return "distributed dataset"
    if isinstance(x, keras.utils.PyDataset):
        return "PyDataset"
    if _compat.is_grain_dataset(x):
        return "grain dataset"
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
            f"{validation_split} with `{arg}` as a {inp.form}. Pass validation_data= instead."
        )
    split_at = int(math.floor(inp.num_examples * (1.0 - validation_split)))
    if split_at == 0 or split_at == inp.num_examples:
        raise ValueError(
            f"`validation_split` leaves no examples on one side: {inp.num_examples} examples split at "
            f"{split_at}. Received: validation_split={validation_split}. Pass a fraction that leaves at least one "
            "example for training and one for validation."
        )
    train = tf.nest.map_structure(lambda a: arrays_lib.row_slice(a, 0, split_at), inp.arrays)
    val = tf.nest.map_structure(lambda a: arrays_lib.row_slice(a, split_at, inp.num_examples), inp.arrays)
    return ArrayInput(train, split_at), ArrayInput(val, inp.num_examples - split_at)


def _keras_view(x: Any, form: str, arg: str, *, class_weight: Any, shuffle: bool, warn: bool) -> _compat.KerasView:
    """`x` as Keras's data adapters read it (a generator's adapter peeks at its first batches, and keeps them);
    their warnings given again as warnings of the user's call."""
    if form in ("generator", "grain dataset"):
        class_weights.refused(class_weight, f"a {form} (Keras refuses it too)", "the weights in the batches it yields")
    if form == "tf.data.Dataset" and x.cardinality() == 0:
        raise ValueError(f"`{arg}` must hold at least one example (model.fit would run epochs of no step and "
                         f"return an empty history). Received: {arg}, an empty tf.data.Dataset (cardinality 0). Pass "
                         "a dataset with examples (check any .take/.filter/.skip).")
    try:
        view = _compat.keras_view(x, class_weight=None if form == "tf.data.Dataset" else class_weight,
                                  shuffle=shuffle, warn=warn)
    except ValueError as err:
        raise ValueError(
            f"`{arg}`, a {form}, must yield batches as (x, y) or (x, y, sample_weight) tuples of arrays. "
            f"Keras could not read it: {err} Yield tuples of NumPy arrays with one row per example."
        ) from None
    for caught in view.warnings:
        warnings.warn(caught.message, caught.category, stacklevel=user_stacklevel())
    return view


def _adapted(view: _compat.KerasView, form: str) -> BatchedInput:
    """A generator, PyDataset or grain dataset, batched by its own code: Keras's adapter reads it.

    Its batches are copied as they come (`_owned`): the tensors that tf.data makes of the NumPy arrays a
    generator yields can share their memory, and a step that computes in place on its share of a batch then
    writes into the user's arrays (a PyDataset that yields slices of its arrays would see its `y` overwritten,
    and its next epoch would train on that). A grain MapDataset batched by
    `.batch()` can also be read record by record (`BatchedInput.by_rows`).
    """
    leading = [tf.TensorShape(np.shape(t))[:1] for t in tf.nest.flatten(view.first) if t is not None]
    batch_size = int(leading[0][0]) if leading and leading[0].rank else None
    whole_tuple = isinstance(view.dataset.element_spec, tuple)  # `map` hands a tuple over as its components

    def owned(dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.map(lambda *parts: _owned(parts if whole_tuple else parts[0]))

    dataset = owned(view.dataset)
    records = _compat.grain_record_batches(view.adapter) if form == "grain dataset" else None
    by_rows = None if records is None else lambda rows: owned(records(rows))
    return BatchedInput(dataset, form, batch_size, view.adapter.num_batches, _per_example(dataset.element_spec),
                        adapter=view.adapter, first=view.first, by_rows=by_rows)


def _owned(batch: Any) -> Any:
    """A batch in memory of its own; an empty `tf.experimental.Optional`, which Keras's adapters make of None
    (an optional input's absence), as None, which Keras's steps hand the model for it."""
    batch = tf.nest.map_structure(lambda t: None if isinstance(t, tf.experimental.Optional) else t, batch)
    return tf.nest.map_structure(lambda t: None if t is None else tf.raw_ops.DeepCopy(x=t), batch,
                                 expand_composites=True)


def _per_example(spec: Any) -> Any:
    return tf.nest.map_structure(
        lambda s: tf.TensorSpec(s.shape[1:], s.dtype) if spec_rank(s) else s, spec)


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


def _as_array(value: Any) -> Any:
    if value is None or isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):  # an optional input's absence;
        return value  # tensors that tf.data reads (`ArrayInput.reader`)
    value = np.asarray(value)
    return value if arrays_lib.is_mapped(value) else as_float32(value)  # a mapped file's rows: as they are taken


def as_slices(data: Any) -> Any:
    """A batch given whole (`train_on_batch`), ready for `tf.data.Dataset.from_tensor_slices`: lists of inputs as
    tuples (a list would be stacked into one tensor), float64 arrays as float32."""
    if isinstance(data, (list, tuple)):
        return tuple(as_slices(part) for part in data)
    if isinstance(data, dict):
        return {key: as_slices(value) for key, value in data.items()}
    return as_float32(data)


def _text_as_bytes(array: np.ndarray) -> np.ndarray:
    """Features that are text (str arrays, or object arrays of str), as UTF-8 bytes: TensorFlow's tf.string."""
    if not isinstance(array, np.ndarray):  # a ragged or sparse tensor
        return array
    if array.dtype.kind == "U" or (array.dtype == object and array.size and all(
            isinstance(v, (str, bytes)) for v in array.flat)):
        encode = np.vectorize(lambda v: v.encode("utf-8") if isinstance(v, str) else v, otypes=[object])
        return encode(array).astype(bytes)
    return array


def _common_length(arrays: Any, arg: str) -> int:
    leaves = [a for a in tf.nest.flatten(arrays) if a is not None]  # None: an optional input's absence
    lengths = [arrays_lib.num_rows(a) for a in leaves]
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
        raise ValueError(f"`{arg}` must hold at least one example (model.fit would run epochs of no step and "
                         f"return an empty history). Received: {arg} with 0 examples. Pass arrays with at least one "
                         "row.")
    return lengths[0]


def _distributed(x: Any, arg: str, *, class_weight: Any, warn: bool) -> BatchedInput | FunctionInput:
    """A dataset the user distributed with a strategy, read from what it was made from: the batched dataset
    (its batches are the global batches, as TensorFlow splits them over the replicas), or the dataset function
    with the `tf.distribute.InputOptions` it was given. Its strategy is the call's (`Trainer._call_strategy`)."""
    source = _compat.distributed_source(x)
    if source.fn is not None:
        class_weights.refused(class_weight, "a dataset distributed from a function", "weights in the datasets it makes")
        return FunctionInput(source.fn, options=source.options, distributed=x)
    view = _keras_view(source.dataset, "tf.data.Dataset", arg, class_weight=class_weight, shuffle=False, warn=warn)
    return _checked_dataset(view, arg, class_weight, batched=True)


def _checked_dataset(view: _compat.KerasView, arg: str, class_weight: Any = None,
                     batched: bool = False) -> DatasetInput | BatchedInput:
    """An unbatched dataset, which the trainer batches, or a batched one (`batched`: known to be), whose batches
    are the global batches."""
    dataset, batched, batch_size = view.dataset, batched or view.batched, view.batch_size
    shapes = [s.shape for s in tf.nest.flatten(dataset.element_spec) if hasattr(s, "shape")]
    if not batched and shapes and all(s.rank and s[0] is None for s in shapes):
        batched = True  # every leading dimension unknown: batches from a source this walk can't see into
    if class_weight is not None:
        spec = dataset.element_spec
        if not (isinstance(spec, tuple) and len(spec) in (2, 3)):
            class_weights.no_targets(class_weight, arg)
        if isinstance(spec, tuple) and len(spec) == 3:
            class_weights.single_target(spec[1], [spec[2]], class_weight)
        if isinstance(spec, tuple) and len(spec) == 2:
            class_weights.single_target(spec[1], [], class_weight)
            dataset = dataset.map(class_weights.dataset_map(class_weight, batched))
    if not batched:
        return DatasetInput(dataset)
    cardinality = int(dataset.cardinality())
    return BatchedInput(dataset, "batched dataset", batch_size, cardinality if cardinality >= 0 else None,
                        _per_example(dataset.element_spec))


