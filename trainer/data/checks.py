"""The data's own checks, run where its form is known (`trainer/data/boundary.py`), before any model is read.

Arrays are checked in full with O(n) NumPy passes: object dtypes, text labels,
NaN/Inf and the sample weights' shape. Datasets are never scanned, since that
would cost an extra pass over the data (and a repeated one never ends): only
their element structure, ranks and cardinality are checked. Dataset functions
are not checked at all; they run on the workers. The checks against the model
are `trainer/model/checks.py`'s.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from trainer.data import arrays as arrays_lib
from trainer.data.array_input import ArrayInput
from trainer.data.dataset_inputs import BatchedInput, DatasetInput
from trainer.data.specs import spec_rank
from trainer.user_line import user_stacklevel

PARTS = ("x", "y", "sample_weight")


def check_data(inp, arg: str, *, steps_arg: str | None, steps: int | None, with_targets: bool = True) -> None:
    """Object arrays, label dtypes and NaN/Inf for arrays; structure and cardinality for datasets."""
    if isinstance(inp, ArrayInput):
        for part, struct in parts(inp.arrays, with_targets).items():
            for name, array in leaves(struct, part):
                if array is not None:  # an optional input's absence
                    _check_array(array, name, part, arg)
        if with_targets and isinstance(inp.arrays, tuple) and len(inp.arrays) == 3:
            _check_sample_weight(inp.arrays[2], arg, per_example=False)
    elif isinstance(inp, (DatasetInput, BatchedInput)):
        spec = inp.example_spec
        if with_targets and isinstance(spec, (tuple, list)) and not 1 <= len(spec) <= 3:
            raise ValueError(
                f"`{arg}` must yield x, (x, y) or (x, y, sample_weight) elements. Received: {arg} with elements "
                f"{describe_spec(spec)}. Map each element to a tuple, e.g. "
                f"{arg}.map(lambda e: (e['image'], e['label']))."
            )
        unknown = [name for part, struct in parts(spec, with_targets).items()
                   for name, leaf in leaves(struct, part) if spec_rank(leaf, 0) is None]
        if unknown:
            raise ValueError(
                f"Every component of `{arg}`'s elements needs a known rank, to be batched and checked against "
                f"the model (model.fit takes them from Keras 3.16, and finds a wrong shape only inside its "
                f"step). Received: {', '.join(unknown)} of unknown rank (as a tf.py_function or "
                f"tf.numpy_function output has). Set the shape in the map, e.g. "
                f"{arg}.map(lambda x, y: (tf.ensure_shape(x, [28, 28, 1]), tf.ensure_shape(y, [])))."
            )
        if with_targets and isinstance(spec, (tuple, list)) and len(spec) == 3:
            _check_sample_weight(spec[2], arg, per_example=True)
        if steps is None and _endless(inp):
            pydataset = inp.form == "PyDataset"
            what, received = (("PyDataset without a length (num_batches None)", "num_batches=None") if pydataset else
                              ("tf.data.Dataset (.repeat() without a count)", "cardinality INFINITE"))
            fix = (f"Pass {steps_arg}=<steps>" + ("" if pydataset else ", or drop .repeat()") if steps_arg
                   else f"Pass finite data, e.g. {arg}.take(<examples>)" if not pydataset
                   else "Give the PyDataset a __len__")
            raise ValueError(
                f"`{arg}` must end, or the trainer must be told when to stop: it is an infinite {what}, which "
                f"model.fit would read forever. "
                f"Received: {arg} with {received}{f', {steps_arg}=None' if steps_arg else ''}. {fix}."
            )


def _endless(inp) -> bool:
    """Whether `inp` never ends: a repeated dataset, or a PyDataset without a length."""
    if inp.form == "PyDataset":
        return inp.num_batches is None
    return inp.dataset.cardinality() == tf.data.INFINITE_CARDINALITY


def _check_sample_weight(weights: Any, arg: str, *, per_example: bool) -> None:
    """Weights as model.fit takes them: per example ((n,) or (n, 1)), or per example and time step ((n, t))."""
    shape = getattr(weights, "shape", None)  # none for a dict of weights
    dims = None if shape is None else list(shape)[0 if per_example else 1:]
    if dims is not None and len(dims) <= 1:
        return
    got = (f"a {type(weights).__name__}" if shape is None
           else f"shape {tuple(shape)}" + (" per element" if per_example else ""))
    raise ValueError(
        f"`{arg}`'s sample_weight must hold one weight per example, or one per example and time step: "
        f"an array of shape (examples,) or (examples, timesteps)"
        f"{' (a scalar or a vector per dataset element)' if per_example else ''}. Received: sample_weight "
        f"with {got}. Weight the examples or their time steps, or put other weighting into the loss."
    )


def _check_array(array: np.ndarray, name: str, part: str, arg: str) -> None:
    if isinstance(array, (tf.RaggedTensor, tf.SparseTensor)):  # its values, checked as an array of them
        array = (array.flat_values if isinstance(array, tf.RaggedTensor) else array.values).numpy()
    if array.dtype == object:
        raise TypeError(
            f"{subject(arg, name)} must be a numeric array. Received: {name} with dtype=object and shape "
            f"{array.shape}, e.g. rows of different lengths (ragged). Pad the rows to one length "
            "(keras.utils.pad_sequences), or pass a tf.data.Dataset through a dataset function."
        )
    if part != "x" and array.dtype.kind in "US":
        raise TypeError(
            f"{subject(arg, name)} must hold numbers. Received: {name} with dtype={array.dtype} "
            f"(e.g. {array.flat[0].item()!r}). Encode the labels as integers, e.g. with "
            "keras.layers.StringLookup or np.unique(y, return_inverse=True)."
        )
    # A mapped file is not scanned: that would read all of it on every worker, which its sharding spares them.
    if array.dtype.kind in "fc" and not arrays_lib.is_mapped(array) and not _all_finite(array):
        bad = ~np.isfinite(array)
        rows = bad.reshape(len(array), -1).any(axis=1)
        warnings.warn(
            f"{subject(arg, name)} holds {int(bad.sum())} non-finite values (NaN or Inf) in {int(rows.sum())} of "
            f"{len(array)} rows (the first in row {int(np.argmax(rows))}). They make the loss and "
            "outputs NaN. Drop or fix those rows (e.g. np.nan_to_num).",
            UserWarning, stacklevel=user_stacklevel(),  # the user's fit/evaluate/predict call
        )


def _all_finite(array: np.ndarray) -> bool:
    # One pass without a temporary array: the sum is finite only when every value is,
    # unless it overflows, which the full check then settles.
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(array.sum()):
            return True
    return bool(np.isfinite(array).all())


def subject(arg: str, name: str) -> str:
    """How an error names part of an argument: "`data` x['a']", or "`x`['a']" for predict's x."""
    return f"`{arg}`{name[len(arg):]}" if name.startswith(arg) else f"`{arg}` {name}"


def describe_spec(spec: Any) -> str:
    """An element's tf.TensorSpecs in words: "(float32[8], int64[])"."""
    return str(tf.nest.map_structure(lambda s: "None" if not hasattr(s, "shape") else f"{s.dtype.name}{list(s.shape)}",
                                     spec)).replace('"', "")


def structure(inp) -> Any:
    return inp.arrays if isinstance(inp, ArrayInput) else inp.example_spec


def parts(struct: Any, with_targets: bool) -> dict[str, Any]:
    """{"x": ..., "y": ..., "sample_weight": ...} of an element, as Keras unpacks it (x alone: {"x": ...})."""
    if not with_targets or not isinstance(struct, (tuple, list)):
        return {"x": struct}
    return dict(zip(PARTS, struct))


def leaves(struct: Any, name: str) -> list[tuple[str, Any]]:
    """(name, leaf) pairs, e.g. ("x['a']", array), in Keras's flattened order (a dict's sorted keys)."""
    if isinstance(struct, dict):
        return [pair for key in sorted_keys(struct) for pair in leaves(struct[key], f"{name}[{key!r}]")]
    if isinstance(struct, (list, tuple)):
        return [pair for i, item in enumerate(struct) for pair in leaves(item, f"{name}[{i}]")]
    return [(name, struct)]


def sorted_keys(keys) -> list:
    try:
        return sorted(keys)
    except TypeError:  # keys of mixed types: Keras's tree sorts those its own way; keep the order given
        return list(keys)
