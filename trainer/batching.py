"""The global batch of a call, and what follows from it for a fit: the steps of an epoch, the warmup and the
learning-rate settings. Pure arithmetic on the Trainer's settings and the call's data; changes nothing."""

from __future__ import annotations

import tensorflow as tf

from trainer import calls, checks, options, scaling
from trainer.data import inputs as inputs_lib
from trainer.data.dataset_inputs import BatchedInput
from trainer.data.pipeline_inputs import FunctionInput
from trainer.engine import engine as engine_lib


class Batching:
    """The Trainer's batch and learning-rate settings, read at each call (they may change between calls).

    Args:
      settings: the Trainer whose public settings each call reads; never written.
      batch_given: whether the Trainer was given a batch (`batch_size` or
        `per_replica_batch_size`) rather than defaulting to 32 per replica.
      base_given: the `base_batch_size` the Trainer was given, or None.
    """

    def __init__(self, settings: options.Settings, *, batch_given: bool, base_given: int | None):
        self.settings = settings
        self.batch_given = batch_given
        self.base_given = base_given

    def plan(self, strategy: tf.distribute.Strategy, inp: inputs_lib.Input | None = None,
             batch_size: int | None = None, planned_batch: int | None = None) -> tuple[scaling.BatchPlan, str]:
        """The global batch, and where it came from when not from the Trainer ("" then).

        Batches the user made (a batched dataset, generator or PyDataset) are
        the global batches, as under `model.fit`; else a `batch_size` given to
        fit/evaluate/predict wins over the Trainer's settings. `planned_batch`
        is the Trainer's batch handed to the model's own method, which batched
        the data with it: batches of that size are the Trainer's.
        """
        replicas = strategy.num_replicas_in_sync
        if isinstance(inp, BatchedInput) and inp.full_batch_size() != (planned_batch or 0):
            return scaling.BatchPlan(inp.full_batch_size(), replicas), f"the {inp.form}'s batches"
        if isinstance(inp, FunctionInput):
            made = scaling.BatchPlan(inp.global_batch_size(strategy), replicas)
            self._check_function_batch(made, batch_size)
            return made, "the dataset function's batches"
        if batch_size is not None:
            unused = ("" if not self.batch_given else
                      f"; Trainer's {'batch_size' if self.settings.batch_size else 'per_replica_batch_size'} not used")
            return (scaling.plan_batch(per_replica_batch_size=None, batch_size=batch_size, num_replicas=replicas),
                    f"fit's batch_size={batch_size}{unused}")
        return self._trainers(replicas), ""

    def schedule(self, strategy: tf.distribute.Strategy, train: inputs_lib.Input, batch_size: int | None,
                 planned_batch: int | None, steps_per_epoch: int | None, scale_lr: bool = True) -> calls.Schedule:
        """The global batch, the steps an epoch runs, the warmup and the learning-rate settings (the rate as
        compiled unless `scale_lr`)."""
        batch, source = self.plan(strategy, train, batch_size, planned_batch)
        user_steps = checks.steps_within_arrays(train, steps_per_epoch, batch.global_batch_size)
        steps_per_epoch = user_steps or train.num_steps(batch.global_batch_size)
        warmup_steps = self._warmup_steps(steps_per_epoch)
        rule = self.settings.lr_scaling if scale_lr else None
        lr = engine_lib.LRSettings(rule, self._base_batch_size(batch, source), batch, warmup_steps)
        return calls.Schedule(batch, source, user_steps, steps_per_epoch, lr)

    def _trainers(self, replicas: int) -> scaling.BatchPlan:
        return scaling.plan_batch(per_replica_batch_size=self.settings.per_replica_batch_size,
                                  batch_size=self.settings.batch_size, num_replicas=replicas)

    def _check_function_batch(self, made: scaling.BatchPlan, batch_size: int | None) -> None:
        """Refuses a batch given explicitly (to the call or the Trainer) that a dataset function's batches
        contradict: the function batches its own data, and the steps run its batches."""
        if batch_size is not None:
            asked, arg = scaling.BatchPlan(batch_size, made.num_replicas), "batch_size"
            name = f"fit's batch_size={batch_size}"
        elif self.batch_given:
            asked = self._trainers(made.num_replicas)
            arg = "batch_size" if self.settings.batch_size is not None else "per_replica_batch_size"
            name = f"Trainer({arg}={getattr(self.settings, arg)})"
        else:
            return
        if asked.global_batch_size != made.global_batch_size:
            raise ValueError(
                f"The dataset function makes batches of {made.per_replica_batch_size} per replica, a global batch "
                f"of {made.global_batch_size} on {made.num_replicas} replica(s), which contradicts {name} (a global "
                f"batch of {asked.global_batch_size}). Received: both. The function batches its own data: drop "
                f"{arg}=, or batch by input_context.get_per_replica_batch_size({asked.global_batch_size}) in it."
            )

    def _base_batch_size(self, batch: scaling.BatchPlan, batch_source: str) -> int:
        """The batch the learning rate was tuned for: a global batch the user fixed keeps its rate."""
        if batch_source and self.base_given is None:
            return batch.global_batch_size
        return self.settings.base_batch_size

    def _warmup_steps(self, steps_per_epoch: int | None) -> int:
        warmup_epochs = self.settings.warmup_epochs
        if not warmup_epochs:
            return self.settings.warmup_steps
        if steps_per_epoch is None:
            raise ValueError(
                f"`warmup_epochs` needs a known epoch length. Received: warmup_epochs={warmup_epochs} "
                "with data of unknown size. Pass warmup_steps, or steps_per_epoch to fit()."
            )
        return int(round(warmup_epochs * steps_per_epoch))
