"""Batch-size and learning-rate rules: pure arithmetic plus one Keras schedule.

The learning rate a user sets is taken as tuned for `base_batch_size`. When the
global batch grows with the replica count, the rate grows with it: linearly for
SGD (Goyal et al. 2017, "Accurate, Large Minibatch SGD") or with the square
root for adaptive optimizers such as Adam, optionally after a linear warmup
from the base rate to the scaled one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import keras

LR_SCALING_RULES = ("auto", "linear", "sqrt", None)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How a global batch is split over replicas."""

    global_batch_size: int
    num_replicas: int

    @property
    def per_replica_batch_size(self) -> int:
        """The largest per-replica share (replicas differ by at most one example)."""
        return -(-self.global_batch_size // self.num_replicas)


def plan_batch(
    *, per_replica_batch_size: int | None, batch_size: int | None, num_replicas: int
) -> BatchPlan:
    """Turns the user's batch arguments into a `BatchPlan` for `num_replicas`."""
    if per_replica_batch_size is not None:
        return BatchPlan(per_replica_batch_size * num_replicas, num_replicas)
    assert batch_size is not None, "validated in Trainer.__init__"
    return BatchPlan(batch_size, num_replicas)


def resolve_lr_rule(rule: str | None, optimizer: keras.optimizers.Optimizer) -> str | None:
    """Maps "auto" to "linear" for SGD-family optimizers and "sqrt" for adaptive ones.

    A `LossScaleOptimizer` (which compile puts around a float16 model's
    optimizer) is judged by the optimizer inside it.
    """
    if rule != "auto":
        return rule
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return "linear" if isinstance(optimizer, keras.optimizers.SGD) else "sqrt"


def lr_factor(rule: str | None, global_batch_size: int, base_batch_size: int) -> float:
    """The factor that takes an LR tuned for `base_batch_size` to `global_batch_size`."""
    ratio = global_batch_size / base_batch_size
    if rule is None:
        return 1.0
    if rule == "linear":
        return ratio
    if rule == "sqrt":
        return math.sqrt(ratio)
    raise ValueError(f"Unknown lr_scaling rule {rule!r}; expected one of {LR_SCALING_RULES}.")


def warmup_multiplier(step: float, warmup_steps: int, factor: float) -> float:
    """Multiplier on the scaled LR at `step`: from 1/factor (the base LR) up to 1.

    Goyal et al. ramp linearly from the base rate to the scaled rate over the
    warmup; `step` counts optimizer updates from 0.
    """
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    start = 1.0 / factor
    return start + (1.0 - start) * (step / warmup_steps)


@keras.saving.register_keras_serializable(package="trainer")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Wraps a schedule (or a constant): multiplies it by `factor`, after a warmup.

    Args:
      base: the user's schedule, or a float learning rate.
      factor: the LR scaling factor for the global batch.
      warmup_steps: optimizer steps to ramp from `base` to `base * factor`.
    """

    def __init__(self, base: float | keras.optimizers.schedules.LearningRateSchedule, factor: float,
                 warmup_steps: int = 0):
        self.base = base
        self.factor = float(factor)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        base = self.base(step) if callable(self.base) else self.base
        if self.warmup_steps > 0:
            start = 1.0 / self.factor
            ramp = keras.ops.minimum(step / float(self.warmup_steps), 1.0)
            multiplier = start + (1.0 - start) * ramp
        else:
            multiplier = 1.0
        return keras.ops.cast(base, "float32") * self.factor * multiplier

    def get_config(self):
        base = self.base
        if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
            base = keras.saving.serialize_keras_object(base)
        return {"base": base, "factor": self.factor, "warmup_steps": self.warmup_steps}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config["base"], dict):
            config["base"] = keras.saving.deserialize_keras_object(config["base"])
        return cls(**config)


@dataclasses.dataclass(frozen=True)
class LRPlan:
    """The learning-rate decision of one fit: rule, unscaled LR, factor, warmup."""

    rule: str | None
    base: float | keras.optimizers.schedules.LearningRateSchedule
    factor: float
    warmup_steps: int

    def float_warmup(self) -> tuple[float, float, int] | None:
        """`(scaled_lr, factor, warmup_steps)` for an in-graph warmup of a float LR.

        None when there is nothing to ramp, or when the LR is a schedule (the
        `ScaledSchedule` wrapper then carries the warmup itself).
        """
        if not self.warmup_steps or not isinstance(self.base, float) or self.factor == 1.0:
            return None
        return (self.base * self.factor, self.factor, self.warmup_steps)

    def describe(self) -> tuple[str, str]:
        """The base and scaled LR, as text for the plan."""
        if isinstance(self.base, float):
            return f"{self.base:.4g}", f"{self.base * self.factor:.4g}"
        name = type(self.base).__name__
        return name, f"{name} x {self.factor:.4g}"


@contextlib.contextmanager
def unscaled_learning_rate(optimizer: Any, plan: LRPlan | None):
    """While saving: `optimizer`'s float LR divided by the factor that `plan` scaled it by.

    A checkpoint then holds the learning rate as the user tuned it, like a
    scaled schedule (which saves its base), so whatever layout loads it scales
    it once for itself instead of scaling the scaled rate again. A rate changed
    by a callback (ReduceLROnPlateau) is divided the same way.
    """
    if optimizer is None or plan is None or plan.factor == 1.0 or not isinstance(plan.base, float):
        yield
        return
    variable = optimizer.learning_rate  # a LossScaleOptimizer's is its inner optimizer's
    current = variable.numpy()
    variable.assign(current / plan.factor)
    try:
        yield
    finally:
        variable.assign(current)


def rescale_learning_rate(optimizer: Any, plan: LRPlan | None) -> None:
    """After restoring an unscaled float learning rate (`unscaled_learning_rate`) into `optimizer` during a
    fit: scales it by this fit's factor, as the fit had scaled the rate it started with."""
    if optimizer is None or plan is None or plan.factor == 1.0 or not isinstance(plan.base, float):
        return
    variable = optimizer.learning_rate
    variable.assign(variable.numpy() * plan.factor)
