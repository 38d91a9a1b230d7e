"""What a call carries from one stage to the next (trainer/stages.py): its checked arguments, its schedule,
and its model once in the strategy's scope."""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from trainer import scaling
from trainer.engine import engine as engine_lib
from trainer.model import models


@dataclasses.dataclass(frozen=True)
class FitCall:
    """fit's own arguments, checked: what the later stages read of them."""

    callbacks: list
    epochs: int
    initial_epoch: int
    steps_per_epoch: int | None  # the user's cap, None for the data's own length
    shuffle: bool
    verbose: int
    validation_steps: int | None
    validation_freq: Any
    validation_batch_size: int | None  # None: training's


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The global batch and what follows from it for one fit."""

    batch: scaling.BatchPlan
    source: str  # where the global batch came from when not from the Trainer's settings ("" then)
    user_steps: int | None  # the steps per epoch the user asked for, checked against the arrays
    steps_per_epoch: int | None  # the steps an epoch runs, when known
    lr: engine_lib.LRSettings


@dataclasses.dataclass(frozen=True)
class Scoped:
    """A call's model once it is in the strategy's scope (`Runs._model_in_scope`)."""

    model: keras.Model  # the model the call runs (a builder's, once built)
    engine: engine_lib.Engine  # its steps under the call's strategy
    lr_plan: scaling.LRPlan | None  # fit's learning-rate plan; None when evaluating, or without a Keras optimizer
    move: Any  # placement.Move: a context manager that brings the user's model back from the scope
    process: str  # what the trainer changed for the whole process, in words (`malloc.tune_process`)


@dataclasses.dataclass(frozen=True)
class OnePass:
    """An `evaluate` or `predict` call's arguments, checked: one pass over the data."""

    model: models.ModelOrBuilder
    inp: Any  # inputs.Input
    batch: scaling.BatchPlan
    steps: int | None  # the user's cap on the steps; None reads all the data
    callbacks: list
