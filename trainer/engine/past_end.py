"""The call `model.fit` makes past the end of data of unknown size, and what it changes without a batch.

The trainer's steps never call past the end, so where `model.fit` would (`Passes.called_past_end`),
`PastEnd.apply` makes that call's changes: each optimizer's step counter and each SeedGenerator move on by what
one step moves them. It must not touch weights, slots or metrics, nor a `LossScaleOptimizer`'s counters, which
wait for the batch under `model.fit` too. Why: docs/exactness.md, "What is not exact" (the end of data of
unknown size).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from trainer import _compat


class PastEnd:
    """The counters a step of `model` moves without its batch, and how far one step moves each."""

    def __init__(self, model: Any):
        self._counters = _step_counters(model)
        self._start = [np.asarray(counter.numpy()) for counter in self._counters]
        self._steps = 0  # steps taken since `_start`, the calls past the end included

    def took(self, steps: int) -> None:
        """Counts steps the trainer ran."""
        self._steps += steps

    def apply(self) -> None:
        """Makes the changes of one call past the end: each counter moves on by one step's move, where every
        step so far moved it alike (a draw inside a `cond` may not: that counter is left as it is)."""
        if self._steps == 0:
            return
        for counter, start in zip(self._counters, self._start):
            moved = np.asarray(counter.numpy()).astype(np.int64) - start.astype(np.int64)
            if np.all(moved % self._steps == 0):
                counter.assign((np.asarray(counter.numpy()).astype(np.int64) + moved // self._steps)
                               .astype(start.dtype))
        self._steps += 1


def _step_counters(model: Any) -> list:
    """The step counters of the optimizers `model` holds (its compiled one, and those a model's own train_step
    keeps as attributes, a GAN's two), and the states of the SeedGenerators of its layers."""
    optimizers = [model.optimizer] if isinstance(getattr(model, "optimizer", None), keras.optimizers.Optimizer) else []
    optimizers += [value for value in vars(model).values() if isinstance(value, keras.optimizers.Optimizer)]
    counters, seen = [], set()
    for optimizer in optimizers:
        if id(optimizer) in seen or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            continue
        seen.add(id(optimizer))
        counters.append(_compat.step_counter(optimizer))
    return counters + _compat.seed_states(model)
