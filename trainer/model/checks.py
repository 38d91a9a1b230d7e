"""Checks of the data against the model's Inputs and output: structure, shapes, dtypes, labels.

Only models built on `keras.Input` (Sequential or functional) declare their
inputs; subclassed models are checked when they first run.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer import _compat
from trainer.data.array_input import ArrayInput
from trainer.data.checks import describe_spec, leaves, parts, sorted_keys, structure, subject
from trainer.data.pipeline_inputs import FunctionInput
from trainer.model import models
from trainer.model.own_steps import ModelSteps

def check_model_inputs(model: keras.Model, inputs, batch) -> None:
    """Targets where the model needs them; feature structure, shapes and dtypes against its Inputs; label range;
    and the first input's batches (`batch`, a `scaling.BatchPlan`) against the model's stateful layers."""
    needing_targets = _compiled_needing_targets(model)
    for inp, arg, with_targets in inputs:
        if isinstance(inp, FunctionInput):
            continue
        split = parts(structure(inp), with_targets)
        feed = _compat.dict_feed(model, list(split["x"])) if isinstance(split["x"], dict) else None
        if with_targets and "y" not in split and needing_targets:
            _refuse_missing_targets(needing_targets, inp, arg)
        _check_features(model, split["x"], feed, arg)
        if isinstance(inp, ArrayInput) and "y" in split:  # datasets can't be scanned cheaply
            _check_sparse_labels(model, split["y"], arg)
    check_fixed_batch(model, inputs[0][0], num_replicas=batch.num_replicas, global_batch_size=batch.global_batch_size)


def _compiled_needing_targets(model: keras.Model) -> list[str]:
    """What of the model's compile needs targets y ("loss", "metrics"): none when its own train step or
    compute_loss runs, or when it trains on add_loss alone. `model.fit(x)` runs Keras's compiled loss on y=None
    and fails inside it."""
    steps = ModelSteps.of(model)
    specs = _compat.compiled_specs(model)
    if steps.train or steps.loss:
        return []
    return [what for what, value in (("loss", specs["loss"]),
                                     ("metrics", specs["metrics"] or specs["weighted_metrics"])) if value]


def _refuse_missing_targets(compiled: list[str], inp, arg: str) -> None:
    """Features alone (no y) train only a model whose loss needs no targets: its own steps, or add_loss only."""
    form = "arrays" if isinstance(inp, ArrayInput) else inp.form
    fix = (f"Pass the targets: fit(model, x, y), or {arg}=(x, y)" if isinstance(inp, ArrayInput) else
           f"Make the {form} yield (x, y) elements, e.g. {arg}.map(lambda e: (e['image'], e['label']))")
    raise ValueError(
        f"`{arg}` holds features only (no targets y), but `model`'s compiled {' and '.join(compiled)} need "
        f"targets. Received: {arg} as {form} with no y{_elements(inp)}. {fix}; or train a model whose own "
        "train_step or compute_loss needs no y."
    )


def _elements(inp) -> str:
    """", elements {'image': float32[28, 28]}": what a dataset yields, for messages ("" for arrays)."""
    return "" if isinstance(inp, ArrayInput) else f", elements {describe_spec(inp.example_spec)}"


def _check_features(model: keras.Model, x: Any, feed: _compat.DictFeed | None, arg: str) -> None:
    """Each array (or element part) of `x` against the model input Keras gives it: by name for a dict that
    Keras takes so (`feed`, from `_compat.dict_feed`; keys beyond the inputs are ignored), else by position."""
    try:
        tensors = list(model.inputs or [])
    except AttributeError:  # subclassed: its inputs are checked when it first runs
        return
    if not tensors:
        return
    if feed is not None:
        _check_keys(feed, x, arg)
        pairs = [(f"x[{key!r}]", x[key], tensor) for key, _, tensor in feed.pairs]
    else:
        flat = leaves(x, "x")  # more arrays than inputs: Keras feeds the first ones (and warns as it does)
        if len(flat) < len(tensors):
            raise ValueError(
                f"{subject(arg, 'x')} must hold one array per model input ({_count_inputs(tensors)}). "
                f"Received: x with {len(flat)} arrays of shapes {[tuple(a.shape) for _, a in flat]}. Pass one "
                "array per input: a list in input order, or a dict keyed by input name."
            )
        pairs = [(name, leaf, t) for (name, leaf), t in zip(flat, tensors)]
    for name, leaf, tensor in pairs:
        if not _absent(leaf):  # None for an input: the model says whether it is optional, as under model.fit
            _check_feature(leaf, name, tensor, arg)


def _absent(leaf: Any) -> bool:
    """Whether data for an input is None (an array) or always None (an element's `NoneTensorSpec`)."""
    return leaf is None or type(leaf).__name__ == "NoneTensorSpec"


def _check_keys(feed: _compat.DictFeed, x: dict, arg: str) -> None:
    """A dict of data against the model's inputs, as Keras takes it (`_compat.dict_feed`)."""
    names = [name for _, name, _ in feed.pairs]
    received = f"x with keys {sorted_keys(x)}"
    if feed.missing:
        raise ValueError(
            f"{subject(arg, 'x')} must have a key for each model input: Keras takes each input's data by its "
            f"name. Received: {received} (missing: {feed.missing}). The model's inputs are {names}: rename the "
            "keys to match (other keys are ignored, as model.fit ignores them)."
        )
    moved = [(key, name) for key, name, _ in feed.pairs if key != name]  # none from Keras 3.16, which feeds by key
    if moved:
        key, name = moved[0]
        raise ValueError(  # Keras 3.8-3.15 only
            f"{subject(arg, 'x')} has keys beyond the model's inputs that sort among them, and for a model built on "
            "a dict of Inputs Keras feeds a dict's values in sorted key order, so model.fit would feed "
            f"x[{key!r}] to input {name!r}. Received: {received}; the model's inputs are {names}. Keep only the "
            f"inputs' keys: {{k: x[k] for k in {names}}}, or build the model on a list of named Inputs "
            "(Keras takes those by name)."
        )


def _check_feature(leaf: Any, name: str, tensor: Any, arg: str) -> None:
    is_array = isinstance(leaf, (np.ndarray, tf.RaggedTensor, tf.SparseTensor))  # rows, not a per-element spec
    shape = tuple(leaf.shape[1:]) if is_array else tuple(leaf.shape)
    got_string = leaf.dtype.kind in "US" if isinstance(leaf, np.ndarray) else leaf.dtype == tf.string
    wants_string = tensor.dtype == "string"
    if got_string != wants_string:
        fix = ("Convert it, e.g. x.astype('float32'), or put a StringLookup or TextVectorization layer "
               "in the model" if got_string else "Pass strings, or change the Input's dtype")
        raise TypeError(
            f"{subject(arg, name)} must match the model's {tensor.dtype} {_input_label(tensor)}. "
            f"Received: {name} with {'text (strings)' if got_string else f'dtype={_dtype_name(leaf)}'}. {fix}."
        )
    expected = tuple(tensor.shape[1:])
    if not _compatible(shape, expected):
        got = f"of shape {tuple(leaf.shape)}" if is_array else f"with per-element shape {shape}"
        raise ValueError(
            f"{subject(arg, name)} must have per-example shape {expected} to match the model's "
            f"{_input_label(tensor)}. Received: {name} {got}. Reshape the data, or build the model "
            f"with keras.Input({shape})."
        )


def _dtype_name(leaf: Any) -> str:
    return str(leaf.dtype) if isinstance(leaf, np.ndarray) else leaf.dtype.name


def _compatible(shape: tuple, expected: tuple) -> bool:
    # Keras squeezes a trailing 1 or adds a missing one (Functional._adjust_input_rank).
    if len(shape) == len(expected) + 1 and shape[-1:] == (1,):
        shape = shape[:-1]
    elif len(shape) == len(expected) - 1 and expected[-1:] == (1,):
        expected = expected[:-1]
    return len(shape) == len(expected) and all(a is None or b is None or a == b for a, b in zip(shape, expected))


def _check_sparse_labels(model: keras.Model, y: Any, arg: str) -> None:
    try:
        outputs = list(model.outputs)
    except AttributeError:  # no Inputs: the class count is unknown until the model runs
        return
    loss = model.loss
    if isinstance(y, dict) and isinstance(loss, dict):
        names = getattr(model, "output_names", [])
        by_name = dict(zip(names, outputs))
        checks = [(f"y[{k!r}]", y[k], loss.get(k), by_name.get(k)) for k in y]
    elif isinstance(y, np.ndarray) and len(outputs) == 1:
        checks = [("y", y, loss, outputs[0])]
    else:
        return
    for name, labels, loss_k, output in checks:
        ignore = _sparse_ignore_class(_compat.resolved_loss(loss_k, labels, output) if output is not None else loss_k)
        if ignore is False or output is None or output.shape[-1] is None or labels.dtype.kind not in "iuf":
            continue
        classes = int(output.shape[-1])
        valid = labels if ignore is None else labels[labels != ignore]
        if valid.size and (valid.min() < 0 or valid.max() >= classes):
            bad = int(np.count_nonzero((valid < 0) | (valid >= classes)))
            raise ValueError(
                f"{subject(arg, name)} must hold class indices in [0, {classes}) for sparse categorical "
                f"crossentropy: the model's output has {classes} units. Received: {name} with "
                f"min={valid.min().item()!r}, max={valid.max().item()!r} ({bad} of {labels.size} labels out of "
                f"range). Use labels 0..{classes - 1}, or give the last layer one unit per class."
            )


def _sparse_ignore_class(loss: Any) -> Any:
    """False unless `loss` (as Keras resolved it) is sparse categorical crossentropy; else its ignore_class
    (None or a label)."""
    if isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
        return loss.get_config().get("ignore_class")
    function = getattr(loss, "fn", loss)  # Keras wraps a loss function it resolved from a name
    return None if function is keras.losses.sparse_categorical_crossentropy else False


def _auto_named(tensor: Any) -> bool:
    return tensor.name.startswith(("keras_tensor", "input_layer"))  # names Keras made up


def _input_label(tensor: Any) -> str:
    return "input" if _auto_named(tensor) else f"input '{tensor.name}'"


def _count_inputs(tensors: list) -> str:
    names = [t.name for t in tensors if not _auto_named(t)]
    return f"{len(tensors)}: {names}" if len(names) == len(tensors) else str(len(tensors))


def check_fixed_batch(model: keras.Model, inp, *, num_replicas: int, global_batch_size: int) -> None:
    """Refuses what a model with stateful layers can't run: they take exactly their fixed batch every step.

    Keras's `fit` would crash on the first step of another size, often the
    last one, after training the epoch. Other models with a fixed batch
    (`keras.Input(batch_shape=...)`) take any batch size, as in Keras.
    """
    stateful = models.stateful_layers(model)
    batch = models.fixed_batch_size(model)
    if not stateful or batch is None:
        return
    layers = f"stateful layers ({', '.join(layer.name for layer in stateful)})"
    if num_replicas > 1:
        raise ValueError(
            f"`model` has {layers}, which keep a state for each row of a fixed batch of {batch}; a strategy can't "
            f"split that batch across replicas. Received: a strategy with {num_replicas} replicas. Train it on one "
            "device (Trainer(strategy=\"default\")), or build the layers with stateful=False."
        )
    if global_batch_size != batch:
        raise ValueError(
            f"`batch_size` must be {batch}, the fixed batch size of `model`'s {layers}. Received: a global batch "
            f"of {global_batch_size}. Pass Trainer(batch_size={batch})."
        )
    n = inp.num_examples
    if n is not None and n % batch:
        raise ValueError(
            f"The data must hold a multiple of {batch} examples: `model`'s {layers} take exactly {batch} in every "
            f"step. Received: {n} examples, which leave a last batch of {n % batch}. Drop the last {n % batch} "
            f"examples (x[:{n - n % batch}]), or pad the data to a multiple of {batch}."
        )
