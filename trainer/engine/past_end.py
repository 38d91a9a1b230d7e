"""The call `model.fit` makes past the end of data of unknown size, and what it changes without a batch.

When Keras cannot tell how many batches a pass has (a generator, a filtered
dataset, TFRecord files, tf.data service) and calls one step at a time
(`steps_per_execution=1`), the pass ends when a call finds the iterator empty:
`iterator.get_next()` raises inside the compiled step. Every stateful op of the
step that does not wait for the batch has run by then, and keeps its effect:

- each optimizer's step counter (`_iterations.assign_add(1)` at the end of
  `apply` reads no gradient), so Adam's bias correction and every schedule
  read one step more;
- each SeedGenerator the step draws from (`next()` assigns its state + [0, 1]
  with no batch in it), so the next epoch's dropout masks are other ones.

Weights, optimizer slots and metrics wait for the batch and do not change.
Measured on Keras 3.8 and 3.15 (TF 2.18, 2.21), one device: 3 epochs of 7
batches leave `iterations` at 8, 16, 24 and a Dropout's seed state 24 draws on,
in 120 of 120 runs (inter-op threads 1 and 2, SGD, Adam, AdamW, 1 to 7
layers). It is not a race: the counter's update has no input from the iterator.

The trainer's steps read an optional and never call past the end, so where
`model.fit` would, `PastEnd.apply` makes the same changes: each counter moves
on by what one step moves it. A `LossScaleOptimizer` applies inside a `cond` on
the gradients' finiteness, which waits for the batch: its counters are left.
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
