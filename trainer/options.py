"""Checks on the Trainer's options and fit's loop arguments: pure Python, raised before any work."""

from __future__ import annotations

import numpy as np

from trainer.scaling import LR_SCALING_RULES

MIXED_PRECISION_POLICIES = (None, "mixed_float16", "mixed_bfloat16")


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
) -> None:
    """Raises ValueError, naming the argument, the value and the fix, for a bad Trainer option."""
    if per_replica_batch_size is not None and batch_size is not None:
        raise ValueError(
            "Pass `per_replica_batch_size` or `batch_size`, not both. Received: "
            f"per_replica_batch_size={per_replica_batch_size}, batch_size={batch_size}. "
            "per_replica_batch_size scales the global batch with the replicas; batch_size fixes it."
        )
    for name, value in (("per_replica_batch_size", per_replica_batch_size), ("batch_size", batch_size),
                        ("base_batch_size", base_batch_size)):
        if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}.")
    if lr_scaling not in LR_SCALING_RULES:
        raise ValueError(
            f"`lr_scaling` must be one of {LR_SCALING_RULES}. Received: lr_scaling={lr_scaling!r}."
        )
    if warmup_epochs and warmup_steps:
        raise ValueError(
            f"Pass `warmup_epochs` or `warmup_steps`, not both. Received: warmup_epochs={warmup_epochs}, "
            f"warmup_steps={warmup_steps}."
        )
    if warmup_epochs < 0 or warmup_steps < 0:
        raise ValueError(f"Warmup must be >= 0. Received: warmup_epochs={warmup_epochs}, warmup_steps={warmup_steps}.")
    if steps_per_execution != "auto" and (not isinstance(steps_per_execution, int) or steps_per_execution < 1):
        raise ValueError(
            "`steps_per_execution` must be a positive integer or 'auto'. "
            f"Received: steps_per_execution={steps_per_execution!r}."
        )
    if mixed_precision not in MIXED_PRECISION_POLICIES:
        raise ValueError(
            f"`mixed_precision` must be one of {MIXED_PRECISION_POLICIES}. Received: "
            f"mixed_precision={mixed_precision!r}. Use 'mixed_float16' on GPUs, 'mixed_bfloat16' on TPUs and "
            "recent GPUs, None for float32."
        )
    if jit_compile not in (True, False, "auto"):
        raise ValueError(f"`jit_compile` must be True, False or 'auto'. Received: jit_compile={jit_compile!r}.")


def check_loop_args(*, epochs: int, initial_epoch: int, steps_per_epoch: int | None) -> None:
    if not isinstance(epochs, (int, np.integer)) or epochs < 0:
        raise ValueError(f"`epochs` must be a non-negative integer. Received: epochs={epochs!r}.")
    if not isinstance(initial_epoch, (int, np.integer)) or not 0 <= initial_epoch <= epochs:
        raise ValueError(
            f"`initial_epoch` must be an integer in [0, epochs]. Received: initial_epoch={initial_epoch!r}, "
            f"epochs={epochs}."
        )
    if steps_per_epoch is not None and (not isinstance(steps_per_epoch, (int, np.integer)) or steps_per_epoch < 1):
        raise ValueError(
            f"`steps_per_epoch` must be a positive integer or None. Received: steps_per_epoch={steps_per_epoch!r}."
        )
