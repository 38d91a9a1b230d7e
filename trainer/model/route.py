"""The trainer beneath `model.fit`: a model's own fit, evaluate and predict, run on the trainer's engine.

`call_model` calls the model's own method, so what its class or a library put there runs first; where that
chain reaches Keras's backend method for this model, the engine runs instead (`_compat.keras_methods_hooked`).
A `Route` is scoped to one call and its model by a context variable: other threads, other models and anything
called while the engine runs (a callback's own `model.evaluate`) must stay Keras's. The route as users meet
it: docs/ecosystem.md, "The route beneath `model.fit`"; who calls whom: docs/design.md, "From `fit` to the step".
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
from typing import Any, Callable

import keras

from trainer import _compat


@dataclasses.dataclass
class Route:
    """Where Keras's own fit, evaluate and predict go while the route is current.

    Attributes:
      engine: `(method name, model, arguments as handed down) -> result`: the trainer's engine.
      model: the one model routed, or None for every model (`Trainer.distribute`).
      method: the method the trainer called on it ("" for `Trainer.distribute`).
      reached: how many times the engine ran under this route.
    """

    engine: Callable[[str, keras.Model, dict[str, Any]], Any]
    model: keras.Model | None = None
    method: str = ""
    reached: int = 0

    def takes(self, model: keras.Model) -> bool:
        return self.model is None or self.model is model


_current: contextvars.ContextVar[Route | None] = contextvars.ContextVar("trainer_route", default=None)


@contextlib.contextmanager
def routed(route: Route):
    """Inside, Keras's own fit, evaluate and predict for the route's model(s), on this thread, run `route.engine`."""
    with _compat.keras_methods_hooked(_dispatch):
        token = _current.set(route)
        try:
            yield route
        finally:
            _current.reset(token)


def call_model(model: keras.Model, method: str, arguments: dict[str, Any],
               engine: Callable[[str, keras.Model, dict[str, Any]], Any]) -> Any:
    """`model.<method>(**arguments)`, where Keras's own method for `model` runs `engine` instead.

    Raises RuntimeError if the model's method returned without reaching Keras's:
    then it did its own work, which the trainer did not distribute.
    """
    with routed(Route(engine, model, method)) as route:
        result = getattr(model, method)(**arguments)
    if not route.reached:
        owner = _owner(model, method)
        raise RuntimeError(
            f"{owner}.{method} returned without calling Keras's own {method} (super().{method}), so nothing ran "
            f"on the trainer's strategy. Make {owner}.{method} end in super().{method}(...) with the data it "
            f"prepared, or call trainer.{method} on that data yourself."
        )
    return result


def _dispatch(name: str, keras_method: Callable, model: keras.Model, args: tuple, kwargs: dict) -> Any:
    route = _current.get()
    if route is None or not route.takes(model) or kwargs.get("_use_cached_eval_dataset"):
        return keras_method(model, *args, **kwargs)
    arguments = keras_method_arguments(keras_method, model, args, kwargs)
    route.reached += 1
    token = _current.set(None)  # what runs inside the engine (a callback's model.evaluate) is Keras's own
    try:
        return route.engine(name, model, arguments)
    finally:
        _current.reset(token)


def keras_method_arguments(method: Callable, model: keras.Model, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments a call of Keras's `method` received, by name, as passed (no defaults filled in)."""
    signature = inspect.signature(method)
    bound = signature.bind(model, *args, **kwargs).arguments
    arguments = {}
    for name, value in list(bound.items())[1:]:  # the first is the model
        if signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
            arguments.update(value)
        else:
            arguments[name] = value
    return arguments


def accepts(method: Callable, name: str) -> bool:
    """Whether `method` takes an argument `name` (by name, or in its **kwargs)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # no signature to read: hand down only what was given
        return False
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _owner(model: keras.Model, method: str) -> str:
    """The class whose `method` a call of `model.<method>` runs (where an override lives)."""
    for cls in type(model).__mro__:
        if method in vars(cls):
            return cls.__name__
    return type(model).__name__


def passed_arguments(method: Callable, values: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a call of the public `method` that differ from its defaults, by name (the model, the
    strategy and `self` aside), to hand to the model's own method, whose defaults then fill in the rest."""
    def given(value, default) -> bool:
        if value is default:
            return False
        if isinstance(value, (bool, int, float, str)) and type(value) is type(default):
            return value != default
        return True

    parameters = inspect.signature(method).parameters
    return {name: values[name] for name, parameter in parameters.items()
            if name not in ("self", "model", "strategy") and given(values[name], parameter.default)}
