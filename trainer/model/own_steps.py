"""Which steps the model's class brings of its own (`ModelSteps`), and the names of what they log: Keras's
metric names, the keys a model's own step returns, `evaluate`'s list order."""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from trainer import _compat

MODEL_STEPS = ("train_step", "test_step", "predict_step", "compute_loss", "compute_metrics")


def overridden(model: keras.Model, name: str) -> bool:
    """Whether `model`'s class brings its own method `name`, not the one of Keras's base model and trainer:
    a user's model, a KerasHub task, Keras's own `keras.distillation.Distiller` (its `compute_loss`)."""
    for klass in type(model).__mro__:
        if name in vars(klass):
            return klass not in keras.Model.__mro__
    return False


@dataclasses.dataclass(frozen=True)
class ModelSteps:
    """Which of its steps the model's class brings: the trainer runs those instead of its own."""

    train: bool = False
    test: bool = False
    predict: bool = False
    loss: bool = False
    metrics: bool = False

    @classmethod
    def of(cls, model: keras.Model) -> "ModelSteps":
        return cls(*(overridden(model, name) for name in MODEL_STEPS))

    def describe(self) -> str:
        """For the plan: whose step runs."""
        owned = [name for name, flag in zip(MODEL_STEPS, dataclasses.astuple(self)) if flag]
        if self.train:
            return (f"the model's own {_names(owned)}, per replica as Keras runs it; Keras's losses "
                    "scaled by each replica's share of the batch")
        if owned:
            return f"the trainer's, calling the model's own {_names(owned)}"
        return "the trainer's (Keras's loss and metrics, each replica weighed by its share of the batch)"

    @staticmethod
    def log_sources(method: str, logs: Any, model: keras.Model,
                    made_by: dict[int, tuple[Any, str]]) -> dict[str, str | None] | None:
        """Which metric each key that the model's step returned reads, at trace time; None for all of them.

        `model.fit` logs `model.get_metrics_result()` when the step returns
        exactly the model's metrics, and otherwise what the step returned. A
        value the step returned is exact across replicas when it is a metric's
        `result()` (`made_by`, from `_compat.results_recorded`): the trainer
        then logs that metric, read across replicas, under the returned key (the
        keras.io VAE returns its "total_loss" tracker as "loss"). Any other
        value (a loss tensor, as keras.io's WGAN-GP returns) maps to None: the
        trainer logs the last step's value, as `model.fit` does (`Objective.hold`).
        """
        names = metric_names(model)
        if not isinstance(logs, dict):
            raise ValueError(
                f"{type(model).__name__}.{method} returned {type(logs).__name__}, and model.fit logs a dict: "
                "return {name: value}, e.g. {m.name: m.result() for m in self.metrics}, as the Keras guide's custom "
                "train_step does."
            )
        returned = _flat_items(logs)
        if {key for key, _ in returned} == set(names):
            return None
        sources = {}
        for key, value in returned:
            made = made_by.get(id(value))
            sources[key] = made[1] if made is not None and made[0] is value else None
        return sources

    @staticmethod
    def returned_values(logs: dict, sources: dict[str, str | None] | None) -> dict[str, Any]:
        """The values the step returned that are no metric's result, by key (`log_sources` mapped them to None)."""
        if sources is None:
            return {}
        return {key: value for key, value in _flat_items(logs) if sources.get(key, "") is None}


def _names(methods: list[str]) -> str:
    return ", ".join(methods[:-1]) + " and " + methods[-1] if len(methods) > 1 else methods[0]


def _flat_items(logs: dict) -> list[tuple[str, Any]]:
    items = []
    for key, value in logs.items():
        items += _flat_items(value) if isinstance(value, dict) else [(key, value)]
    return items


def metric_names(model: keras.Model) -> list[str]:
    """The keys of `model.get_metrics_result()`, without reading any variable."""
    names = []
    for metric in model.metrics:
        inner = _compat.compiled_metric_list(metric)
        names += [m.name for m in inner] if inner is not None else [metric.name]
    return names


def logs_in_order(model: keras.Model, logs: dict[str, float]) -> float | list[float]:
    """`logs` as `model.evaluate(return_dict=False)` lists them: in the order of the model's metrics, then the
    others by name; a single value alone."""
    names = metric_names(model)
    values = [logs[name] for name in names if name in logs] + [logs[key] for key in sorted(logs) if key not in names]
    return values[0] if len(values) == 1 else values
