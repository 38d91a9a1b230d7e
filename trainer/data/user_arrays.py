"""Arrays as the user gives them (NumPy arrays, lists and dicts of them, text, ragged or sparse tensors,
memory-mapped files) -> the `ArrayInput` the trainer reads.

Refuses, naming the argument and the fix, lists of numbers (which Keras would read as one input per element)
and arrays that can't be read as rows (no leading dimension, unequal lengths, no rows). Arrays convert as
Keras converts them; a mapped file is not converted here: its rows are taken as the steps need them.
"""

from __future__ import annotations

import numbers
import reprlib
from typing import Any

import numpy as np
import tensorflow as tf

from trainer.data import arrays as arrays_lib
from trainer.data.array_input import ArrayInput
from trainer.data.arrays import as_float32
from trainer.data.checks import subject


def arrays_input(data: Any, arg: str, *, with_targets: bool) -> ArrayInput:
    """`data` as `boundary.as_input` packed it (`(x, y[, sample_weight])`, or the features alone), checked, and
    converted: text as UTF-8 bytes, float64 as float32."""
    if with_targets and isinstance(data, tuple):
        for name, part in zip(("x", "y", "sample_weight"), data):
            _reject_nested_lists(part, arg, name)
        arrays = tf.nest.map_structure(_as_array, data)
        arrays = (tf.nest.map_structure(_text_as_bytes, arrays[0]), *arrays[1:])
    else:
        _reject_nested_lists(data, arg, "x" if with_targets else arg)
        arrays = tf.nest.map_structure(_text_as_bytes, tf.nest.map_structure(_as_array, data))
    return ArrayInput(arrays, _common_length(arrays, arg))


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
        raise ValueError(f"`{arg}` must hold at least one example (model.fit runs epochs of no step and "
                         f"returns an empty history up to Keras 3.15, and refuses it from 3.16). Received: {arg} "
                         "with 0 examples. Pass arrays with at least one row.")
    return lengths[0]
