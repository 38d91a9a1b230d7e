"""Cheap checks of fit/evaluate/predict inputs, run before any variable changes or file is written.

Array inputs are checked in full with O(n) NumPy passes: object dtypes,
NaN/Inf, and sparse labels against the model's class count (model_checks.py,
with shapes and dtypes against the model's Inputs). Datasets are never
scanned, since that would cost an extra pass over the data (and a repeated one
never ends): only their element structure, static shapes and cardinality are
checked. Dataset functions are not checked at all; they run on the workers.
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer import inputs as inputs_lib
from trainer import models
from trainer.data import subject
from trainer.model_checks import check_model_inputs, describe_spec, leaves, parts
from trainer.route import user_stacklevel


def check_fit(model, train, val, *, steps_per_epoch, epoch_steps, epochs, initial_epoch, warmup,
              global_batch_size) -> Any:
    """Checks fit's inputs and warmup; returns `model`, or for a builder, one that checks what it builds.

    Args:
      steps_per_epoch: the user's value (None: one pass over the data).
      epoch_steps: the steps an epoch will run, when known.
      warmup: (warmup_epochs, warmup_steps): the Trainer's setting and the steps it comes to.
      global_batch_size: examples per step.
    """
    check_data(train, "data", steps_arg="steps_per_epoch", steps=steps_per_epoch)
    if val is not None:
        check_data(val, "validation_data", steps_arg=None, steps=None)
    if epoch_steps is not None:
        check_warmup(*warmup, planned_steps=epoch_steps * (epochs - initial_epoch), done=_iterations(model))
    return _against_model(model, [(train, "data", True), (val, "validation_data", True)])


def steps_within_arrays(train, steps_per_epoch: int | None, global_batch_size: int) -> int | None:
    """`steps_per_epoch` for arrays: beyond one pass over them, each epoch ends with the data, as under
    model.fit, which warns as here (its words) and goes on."""
    if not isinstance(train, inputs_lib.ArrayInput) or steps_per_epoch is None:
        return steps_per_epoch
    if steps_per_epoch <= train.num_steps(global_batch_size):
        return steps_per_epoch
    warnings.warn("Your input ran out of data; interrupting training. Make sure that your dataset or generator can "
                  "generate at least `steps_per_epoch * epochs` batches. You may need to use the `.repeat()` function "
                  "when building your dataset.", stacklevel=user_stacklevel())
    return None


def check_callbacks(callbacks: Any) -> list:
    """`callbacks` as a list of `keras.callbacks.Callback`s: a list, a tuple or one callback, as Keras's
    CallbackList takes them."""
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(
            f"`callbacks` must be a list of keras.callbacks.Callback instances. Received: callbacks={callbacks!r} "
            f"of type {type(callbacks).__name__}. Pass a list: callbacks=[...]."
        )
    for i, callback in enumerate(callbacks):
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(
                f"`callbacks[{i}]` must be a keras.callbacks.Callback. Received: {callback!r} of type "
                f"{type(callback).__name__}. Subclass keras.callbacks.Callback (or use keras.callbacks.LambdaCallback)."
            )
    return list(callbacks)


def check_callbacks_on_workers(callbacks: list, num_workers: int) -> None:
    """Refuses Keras's own BackupAndRestore on several workers: every worker would write the same files."""
    for i, callback in enumerate(callbacks):
        if type(callback) is keras.callbacks.BackupAndRestore and num_workers > 1:
            raise ValueError(
                f"`callbacks[{i}]` is Keras's own keras.callbacks.BackupAndRestore, whose every worker writes the "
                f"same backup files. Received: it, with {num_workers} workers. Use the trainer's: `from "
                "trainer.callbacks import BackupAndRestore`, BackupAndRestore(backup_dir), which the chief writes and "
                "which resumes mid-epoch on every strategy (or train on one worker)."
            )


def check_evaluate(model, inp, *, steps) -> Any:
    """Checks evaluate's inputs; returns `model` as `check_fit` does."""
    check_data(inp, "data", steps_arg="steps", steps=steps)
    return _against_model(model, [(inp, "data", True)])


def check_predict(model, inp) -> Any:
    """Checks predict's input; returns `model` as `check_fit` does."""
    check_data(inp, "x", steps_arg=None, steps=None, with_targets=False)
    return _against_model(model, [(inp, "x", False)])


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


# Model-free checks ---------------------------------------------------------------


def check_data(inp, arg: str, *, steps_arg: str | None, steps: int | None, with_targets: bool = True) -> None:
    """Object arrays, label dtypes and NaN/Inf for arrays; structure and cardinality for datasets."""
    if isinstance(inp, inputs_lib.ArrayInput):
        for part, struct in parts(inp.arrays, with_targets).items():
            for name, array in leaves(struct, part):
                _check_array(array, name, part, arg)
        if with_targets and isinstance(inp.arrays, tuple) and len(inp.arrays) == 3:
            _check_sample_weight(inp.arrays[2], arg, per_example=False)
    elif isinstance(inp, (inputs_lib.DatasetInput, inputs_lib.BatchedInput)):
        spec = inp.example_spec
        if with_targets and isinstance(spec, (tuple, list)) and not 1 <= len(spec) <= 3:
            raise ValueError(
                f"`{arg}` must yield x, (x, y) or (x, y, sample_weight) elements. Received: {arg} with elements "
                f"{describe_spec(spec)}. Map each element to a tuple, e.g. "
                f"{arg}.map(lambda e: (e['image'], e['label']))."
            )
        unknown = [name for part, struct in parts(spec, with_targets).items()
                   for name, leaf in leaves(struct, part) if leaf.shape.rank is None]
        if unknown:
            raise ValueError(
                f"Every component of `{arg}`'s elements needs a known rank, to be batched and checked against "
                f"the model. Received: {', '.join(unknown)} of unknown rank (as a tf.py_function or "
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
    if array.dtype.kind in "fc" and not _all_finite(array):
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


def check_warmup(warmup_epochs: float, warmup_steps: int, *, planned_steps: int, done: int) -> None:
    """Raises when the warmup outlasts the training this fit will do."""
    if planned_steps <= 0 or warmup_steps <= done + planned_steps:
        return
    arg, value = ("warmup_epochs", warmup_epochs) if warmup_epochs else ("warmup_steps", warmup_steps)
    raise ValueError(
        f"`{arg}` must end within training: the warmup lasts {warmup_steps} steps but this fit trains "
        f"{planned_steps} (optimizer at step {done}). Received: {arg}={value!r}. Lower it to at most "
        f"{done + planned_steps} steps, or train for more epochs."
    )


def _iterations(model) -> int:
    optimizer = getattr(model, "optimizer", None) if isinstance(model, keras.Model) else None
    return int(optimizer.iterations.numpy()) if optimizer is not None else 0


# Checks against the model -----------------------------------------------------------


def _against_model(model, inputs) -> Any:
    inputs = [i for i in inputs if i[0] is not None]
    if isinstance(model, keras.Model):
        check_model_inputs(model, inputs)
        return model
    if not callable(model):
        models.check_compiled(model)  # raises: neither a model nor a builder

    def build_and_check():
        built = model()
        if isinstance(built, keras.Model):
            check_model_inputs(built, inputs)
        return built

    return build_and_check
