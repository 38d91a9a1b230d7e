"""Checks on the Trainer's options and fit's loop arguments: pure Python, raised before any work.

Every error follows one template: "`arg` must be X. Received: arg=... . <fix>".
A value of the wrong type raises TypeError; a value out of range, ValueError.
"""

from __future__ import annotations

import numbers
from typing import Protocol

import numpy as np

from trainer.scaling import LR_SCALING_RULES

MIXED_PRECISION_POLICIES = (None, "mixed_float16", "mixed_bfloat16")
BATCH_NORM_MODES = ("global", "per_replica")
DATA_SHARDING = ("exact", "files")


class Settings(Protocol):
    """A Trainer's settings as its runs read them at each call: its public attributes (`Trainer` documents
    them), checked by `check_trainer_options` when it was made."""

    per_replica_batch_size: int | None
    batch_size: int | None
    lr_scaling: str | None
    base_batch_size: int
    warmup_epochs: float
    warmup_steps: int
    seed: int | None
    shuffle: bool
    steps_per_execution: int | str
    jit_compile: bool | str
    mixed_precision: str | None
    batch_norm: str
    verbose: int
    nan_guard: bool
    tune_malloc: bool
    data_sharding: str
    file_shards: int


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value, *, minimum: int, fix: str, allow_none: bool = False) -> None:
    """Raises TypeError unless `value` is an int (bool excluded), ValueError when below `minimum`."""
    if value is None and allow_none:
        return
    what = f"an integer >= {minimum}" + (" or None" if allow_none else "")
    if not _is_int(value):
        raise TypeError(f"`{name}` must be {what}. Received: {name}={value!r} of type {type(value).__name__}. {fix}")
    if value < minimum:
        raise ValueError(f"`{name}` must be {what}. Received: {name}={value!r}. {fix}")


def check_trainer_options(
    *,
    per_replica_batch_size,
    batch_size,
    base_batch_size,
    lr_scaling,
    warmup_epochs,
    warmup_steps,
    steps_per_execution,
    jit_compile,
    mixed_precision=None,
    seed=0,
    nan_guard=True,
    tune_malloc=True,
    batch_norm="global",
    data_sharding="exact",
    file_shards=8,
) -> None:
    """Raises ValueError or TypeError, naming the argument, the value and the fix, for a bad Trainer option."""
    check_int("seed", seed, minimum=0, allow_none=True, fix="Pass a non-negative integer, e.g. seed=0; it fixes "
              "the shuffle order and a builder's initial weights (None: neither is fixed).")
    for name, value in (("nan_guard", nan_guard), ("tune_malloc", tune_malloc)):
        if not isinstance(value, bool):
            raise TypeError(f"`{name}` must be True or False. Received: {name}={value!r} of type "
                            f"{type(value).__name__}. Pass {name}=True or {name}=False.")
    if batch_norm not in BATCH_NORM_MODES:
        raise ValueError(
            f"`batch_norm` must be one of {BATCH_NORM_MODES}. Received: batch_norm={batch_norm!r}. Pass 'global' "
            "(the one-device statistics on any number of replicas) or 'per_replica' (each replica's own, faster)."
        )
    if data_sharding not in DATA_SHARDING:
        raise ValueError(
            f"`data_sharding` must be one of {DATA_SHARDING}. Received: data_sharding={data_sharding!r}. Pass 'exact' "
            "(every worker reads every batch of a dataset and keeps its share: model.fit's numbers) or 'files' (each "
            "worker reads its file shards: the same numbers on any layout, not model.fit's)."
        )
    check_int("file_shards", file_shards, minimum=1, fix="Pass a positive number of file shards, e.g. file_shards=8.")
    if per_replica_batch_size is not None and batch_size is not None:
        raise ValueError(
            "Pass `per_replica_batch_size` or `batch_size`, not both. Received: "
            f"per_replica_batch_size={per_replica_batch_size}, batch_size={batch_size}. "
            "per_replica_batch_size scales the global batch with the replicas; batch_size fixes it."
        )
    for name, value in (("per_replica_batch_size", per_replica_batch_size), ("batch_size", batch_size),
                        ("base_batch_size", base_batch_size)):
        check_int(name, value, minimum=1, allow_none=True, fix=f"Pass a positive number of examples, e.g. {name}=32.")
    if lr_scaling not in LR_SCALING_RULES:
        raise ValueError(
            f"`lr_scaling` must be one of {LR_SCALING_RULES}. Received: lr_scaling={lr_scaling!r}. "
            "Pass 'auto' (linear for SGD, sqrt for adaptive optimizers), or None to keep the model's rate."
        )
    for name, value in (("warmup_epochs", warmup_epochs), ("warmup_steps", warmup_steps)):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise TypeError(f"`{name}` must be a number >= 0. Received: {name}={value!r}. Pass e.g. {name}=2.")
        if value < 0:
            raise ValueError(f"`{name}` must be >= 0. Received: {name}={value!r}. Pass 0 for no warmup.")
    check_int("warmup_steps", warmup_steps, minimum=0, fix="Pass a whole number of optimizer steps.")
    if warmup_epochs and warmup_steps:
        raise ValueError(
            f"Pass `warmup_epochs` or `warmup_steps`, not both. Received: warmup_epochs={warmup_epochs}, "
            f"warmup_steps={warmup_steps}. Set the other one to 0."
        )
    if mixed_precision not in MIXED_PRECISION_POLICIES:
        raise ValueError(
            f"`mixed_precision` must be one of {MIXED_PRECISION_POLICIES}. Received: "
            f"mixed_precision={mixed_precision!r}. Use 'mixed_float16' on GPUs, 'mixed_bfloat16' on TPUs, "
            "recent GPUs and CPUs with AMX, None for float32."
        )
    if steps_per_execution != "auto":
        check_int("steps_per_execution", steps_per_execution, minimum=1,
                  fix="Pass a positive integer, or 'auto' (sized from the measured step time).")
    if jit_compile not in (True, False, "auto"):
        raise ValueError(
            f"`jit_compile` must be True, False or 'auto'. Received: jit_compile={jit_compile!r}. "
            "Pass 'auto' to use XLA on GPUs and TPUs only."
        )


def loop_args(*, epochs, initial_epoch: int, steps_per_epoch) -> tuple[int, int | None]:
    """fit's epochs and steps_per_epoch as Keras reads them; returns (epochs, steps_per_epoch).

    Keras trains `range(initial_epoch, epochs)`: an `epochs` at or below `initial_epoch` (0, negative) trains
    nothing, and True counts as 1. A `steps_per_epoch` of 0 is one pass, as None is.
    """
    if not isinstance(epochs, (int, np.integer)):
        raise TypeError(f"`epochs` must be an integer. Received: epochs={epochs!r} of type {type(epochs).__name__}. "
                        "Pass the epoch to stop after, e.g. epochs=10.")
    check_int("initial_epoch", initial_epoch, minimum=0, fix="Pass the epoch to start from, e.g. initial_epoch=0.")
    check_int("steps_per_epoch", steps_per_epoch, minimum=0, allow_none=True,
              fix="Pass a positive number of steps, or None for one pass over the data.")
    return max(int(epochs), initial_epoch), steps_per_epoch or None


def steps_arg(name: str, steps, fix: str) -> int | None:
    """A step count (evaluate's and predict's `steps`, fit's `validation_steps`): 0 means all, as None does in
    Keras."""
    check_int(name, steps, minimum=0, allow_none=True, fix=fix)
    return steps or None


def check_validation_freq(validation_freq) -> None:
    """Keras's two forms: every n-th epoch, or the (1-based) epochs to validate after. A 0 is refused where
    fit validates (Keras divides by it); without validation data Keras never reads it."""
    if isinstance(validation_freq, (list, tuple)):
        for epoch in validation_freq:
            check_int("validation_freq", epoch, minimum=1,
                      fix="List the epochs to validate after, counted from 1, e.g. validation_freq=[1, 5, 10].")
        return
    check_int("validation_freq", validation_freq, minimum=0,
              fix="Pass a positive number of epochs, e.g. 1, or a list of epochs, e.g. [1, 5].")


def check_fit_args(*, batch_size: int | None = None, validation_split: float = 0.0, validation_freq=1,
                   validation_batch_size: int | None = None) -> None:
    """The Keras arguments of fit (evaluate and predict take `batch_size`), before anything runs."""
    check_int("batch_size", batch_size, minimum=1, allow_none=True,
              fix="Pass the global batch size, e.g. batch_size=64, or None for the Trainer's.")
    check_int("validation_batch_size", validation_batch_size, minimum=1, allow_none=True,
              fix="Pass the validation batch size, or None for the training batch size.")
    check_validation_freq(validation_freq)
    if isinstance(validation_split, bool) or not isinstance(validation_split, (int, float)):
        raise TypeError(
            f"`validation_split` must be a float in [0, 1). Received: validation_split={validation_split!r} of type "
            f"{type(validation_split).__name__}. Pass a fraction, e.g. validation_split=0.2."
        )
    if not 0.0 <= validation_split < 1.0:
        raise ValueError(
            f"`validation_split` must be in [0, 1): the fraction of the examples to validate on (model.fit takes a "
            f"negative one as an empty split, and validates on nothing). Received: validation_split="
            f"{validation_split!r}. Pass a fraction, e.g. validation_split=0.2."
        )
