"""`TrainContext`: the running fit as callbacks may see it, the one handshake between the loop and them.

Callbacks that need the trainer's state (the epoch and step, the cluster role,
where to resume) define `set_trainer_context(context)` and receive it; nothing
reads private model fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from trainer.data.marks import Reading
from trainer.distribute.cluster import ClusterInfo
from trainer.engine.fusion import StepFusion
from trainer.engine.plan import Plan


@dataclasses.dataclass
class TrainContext:
    """The running `fit`, as callbacks may see it.

    Attributes:
      strategy: the strategy training runs under.
      cluster: this task's role; `is_chief` says whether it owns side effects.
      plan: what fit decided (batch sizes, steps per epoch, ...).
      epochs: the epoch to stop after.
      epoch: the current epoch.
      step: steps finished in the current epoch.
      initial_epoch, initial_step: where training starts. A callback may move
        them forward in `on_train_begin` to resume (see BackupAndRestore).
      initial_metric_states: with a mid-epoch `initial_step`, what the model's
        metric variables held there (`metric_states` of the run that stopped),
        so that the resumed epoch logs its metrics over all of its steps.
      metric_states: the model's metric variables as one device holds them, at
        the last step boundary; kept while a callback resumes (`resumes = True`).
      examples_seen: examples trained on in this call to fit.
      fusion: how many steps each call runs (fixed, or sized from step time).
      step_seconds: wall seconds spent inside step calls in this call to fit
        (input included); the rest of fit's time is callbacks, logging and set-up.
      lr_plan: how fit scaled `model.optimizer`'s learning rate (`scaling.LRPlan`),
        or None; a checkpoint saves the rate unscaled.
      on_leave: what callbacks set up for the fit's duration and undo when it
        leaves, whether it ends or raises (Keras's protocol has no hook for an
        error): BackupAndRestore's SIGTERM handler. Run last first.
      resumable: a callback resumes the fit (`resumes = True`): the readers mark
        their places (`trainer/data/marks.py`).
      reading: where the reader is at the last step boundary (`marks.Reading`),
        while the fit is resumable; a backup holds it.
      initial_reading: a backup's `reading`, where a resumed fit's first reader
        starts (set by a resuming callback in `on_train_begin`).
      deferred: what a callback leaves (`defer`) for once every callback has had
        the step's or the epoch's end hook: BackupAndRestore's save, so that a
        backup never says an epoch is done before a logger wrote its row or a
        checkpoint was taken.
    """

    strategy: tf.distribute.Strategy
    cluster: ClusterInfo
    plan: Plan
    epochs: int
    initial_epoch: int = 0
    initial_step: int = 0
    initial_metric_states: list[np.ndarray] | None = None
    metric_states: list[np.ndarray] | None = None
    epoch: int = 0
    step: int = 0
    examples_seen: int = 0
    fusion: StepFusion = dataclasses.field(default_factory=lambda: StepFusion(1))
    step_seconds: float = 0.0
    lr_plan: Any = None
    on_leave: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    deferred: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    resumable: bool = False
    reading: Reading | None = None
    initial_reading: Reading | None = None

    @property
    def is_chief(self) -> bool:
        return self.cluster.is_chief

    def defer(self, work: Callable[[], None]) -> None:
        self.deferred.append(work)

    def run_deferred(self) -> None:
        """Runs what the callbacks deferred at this boundary, in the order they deferred it."""
        work, self.deferred[:] = list(self.deferred), []
        for item in work:
            item()

    def examples_in(self, steps: int, first_step: int) -> int:
        """Examples in `steps` steps from `first_step` of an epoch (the last batch may be partial)."""
        batch, total = self.plan.global_batch_size, self.plan.num_examples
        if total is None:
            return steps * batch
        return max(0, min(total, (first_step + steps) * batch) - first_step * batch)
