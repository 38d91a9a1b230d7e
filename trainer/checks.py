"""The call's own checks, run before any variable changes or file is written: callbacks, steps, warmup, and
the data against the model (`trainer/model/checks.py`; the data's own checks ran where it was read,
`trainer/data/checks.py`).
"""

from __future__ import annotations

import warnings
from typing import Any

import keras

from trainer import _compat
from trainer.data import passes
from trainer.data.array_input import ArrayInput
from trainer.model import models
from trainer.model.checks import check_model_inputs
from trainer.user_line import user_stacklevel


def check_fit(model, train, val, *, batch, epoch_steps, epochs, initial_epoch, warmup) -> Any:
    """Checks fit's inputs against the model, and the warmup; returns `model`, or for a builder, one that
    checks what it builds.

    Args:
      epoch_steps: the steps an epoch will run, when known.
      warmup: (warmup_epochs, warmup_steps): the Trainer's setting and the steps it comes to.
    """
    if epoch_steps is not None:
        check_warmup(*warmup, planned_steps=epoch_steps * (epochs - initial_epoch), done=_iterations(model))
    return _against_model(model, [(train, "data", True), (val, "validation_data", True)], batch)


def steps_within_arrays(train, steps_per_epoch: int | None, global_batch_size: int) -> int | None:
    """`steps_per_epoch` for arrays: beyond one pass over them, each epoch ends with the data, as under
    model.fit, which warns as here (its words) and goes on."""
    if not isinstance(train, ArrayInput) or steps_per_epoch is None:
        return steps_per_epoch
    if steps_per_epoch <= train.num_steps(global_batch_size):
        return steps_per_epoch
    warnings.warn(passes.RAN_OUT, stacklevel=user_stacklevel())
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


def check_evaluate(model, inp, *, batch) -> Any:
    """Checks evaluate's inputs against the model; returns `model` as `check_fit` does."""
    return _against_model(model, [(inp, "data", True)], batch)


def check_predict(model, inp, *, batch) -> Any:
    """Checks predict's input against the model; returns `model` as `check_fit` does."""
    return _against_model(model, [(inp, "x", False)], batch)


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
    optimizer = getattr(model, "optimizer", None) if _compat.is_model(model) else None
    return int(optimizer.iterations.numpy()) if optimizer is not None else 0


# Checks against the model -----------------------------------------------------------


def _against_model(model, inputs, batch) -> Any:
    inputs = [i for i in inputs if i[0] is not None]
    if _compat.is_model(model):
        check_model_inputs(model, inputs, batch)
        return model
    if not callable(model):
        models.check_compiled(model)  # raises: neither a model nor a builder

    def build_and_check():
        built = model()
        if _compat.is_model(built):
            check_model_inputs(built, inputs, batch)
        return built

    return build_and_check
