"""The boundary: what the user passed to fit, evaluate or predict -> one input kind, checked.

`as_input` and `fit_inputs` (which also cuts `validation_split`) recognise the form, hand it to the module that
reads it (`trainer/data/user_arrays.py`, `trainer/data/keras_forms.py`), fold in `class_weight` and run the
data's own checks (`check_workers`, `trainer/data/checks.py`). The checks against the model do not belong here:
they come later, once it is known. The forms: docs/input_forms.md.
"""

from __future__ import annotations

import math
import numbers
import reprlib
import types
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer import _compat
from trainer.data import class_weights
from trainer.data import arrays as arrays_lib
from trainer.data import keras_forms
from trainer.data import user_arrays
from trainer.data.array_input import ArrayInput
from trainer.data.arrays import as_float32
from trainer.data.checks import check_data
from trainer.data.dataset_inputs import BatchedInput
from trainer.data.features import features
from trainer.data.inputs import Input
from trainer.data.pipeline_inputs import FunctionInput


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
        return keras_forms.keras_input(x, form, arg, class_weight=class_weight, shuffle=shuffle, warn=warn)
    if form == "function":
        class_weights.refused(class_weight, "a dataset function", "weights in the dataset it returns")
        return FunctionInput(x)
    if form == "distributed dataset":
        return keras_forms.distributed_input(x, arg, class_weight=class_weight, warn=warn)
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
    inp = user_arrays.arrays_input(data, arg, with_targets=with_targets)
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


def as_slices(data: Any) -> Any:
    """A batch given whole (`train_on_batch`), ready for `tf.data.Dataset.from_tensor_slices`: lists of inputs as
    tuples (a list would be stacked into one tensor), float64 arrays as float32."""
    if isinstance(data, (list, tuple)):
        return tuple(as_slices(part) for part in data)
    if isinstance(data, dict):
        return {key: as_slices(value) for key, value in data.items()}
    return as_float32(data)
