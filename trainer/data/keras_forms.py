"""The forms that Keras's data adapters read -> input kinds: a tf.data.Dataset (batched or not), a generator,
a PyDataset or a grain dataset; and a dataset the user distributed with a strategy, read from what it was made
from (its batched dataset, read the same way, or its dataset function).

Each goes through Keras's own adapter (`_compat.keras_view`), so that its warnings, workers, queue and epoch
hooks are those of model.fit; a refusal names the argument and the fix. It reads no batch itself: what it
knows comes from the adapter's view (with any batch the adapter peeked at) and the element spec.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from trainer import _compat
from trainer.data import class_weights
from trainer.data.dataset_inputs import BatchedInput, DatasetInput
from trainer.data.pipeline_inputs import FunctionInput
from trainer.data.specs import spec_rank
from trainer.user_line import user_stacklevel


def keras_input(x: Any, form: str, arg: str, *, class_weight: Any, shuffle: bool,
                warn: bool) -> DatasetInput | BatchedInput:
    """`x`, a tf.data.Dataset, generator, PyDataset or grain dataset (`form`), as Keras's adapters read it: a
    dataset the trainer batches, or the batches the user made."""
    view = _keras_view(x, form, arg, class_weight=class_weight, shuffle=shuffle, warn=warn)
    return _checked_dataset(view, arg, class_weight) if form == "tf.data.Dataset" else _adapted(view, form)


def distributed_input(x: Any, arg: str, *, class_weight: Any, warn: bool) -> BatchedInput | FunctionInput:
    """A dataset the user distributed with a strategy, read from what it was made from: the batched dataset
    (its batches are the global batches, as TensorFlow splits them over the replicas), or the dataset function
    with the `tf.distribute.InputOptions` it was given. Its strategy is the call's (`Trainer._call_strategy`)."""
    source = _compat.distributed_source(x)
    if source.fn is not None:
        class_weights.refused(class_weight, "a dataset distributed from a function", "weights in the datasets it makes")
        return FunctionInput(source.fn, options=source.options, distributed=x)
    view = _keras_view(source.dataset, "tf.data.Dataset", arg, class_weight=class_weight, shuffle=False, warn=warn)
    return _checked_dataset(view, arg, class_weight, batched=True)


def _keras_view(x: Any, form: str, arg: str, *, class_weight: Any, shuffle: bool, warn: bool) -> _compat.KerasView:
    """`x` as Keras's data adapters read it (a generator's adapter peeks at its first batches, and keeps them);
    their warnings given again as warnings of the user's call."""
    if form in ("generator", "grain dataset"):
        class_weights.refused(class_weight, f"a {form} (Keras refuses it too)", "the weights in the batches it yields")
    if form == "tf.data.Dataset" and x.cardinality() == 0:
        raise ValueError(f"`{arg}` must hold at least one example (model.fit runs epochs of no step and "
                         f"returns an empty history up to Keras 3.15, and refuses it from 3.16). Received: {arg}, an "
                         "empty tf.data.Dataset (cardinality 0). Pass a dataset with examples (check any "
                         ".take/.filter/.skip).")
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
