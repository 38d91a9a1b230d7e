"""What predict feeds the model from an input: the features of its elements, as Keras's predict reads them.

Only datasets and batches are mapped to their features; arrays (given as x alone) and dataset functions pass
as they are. Of the model it reads only its inputs, and only to keep a multi-input model's tuple whole.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer import _compat
from trainer.data.dataset_inputs import BatchedInput, DatasetInput
from trainer.data.inputs import Input


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
