"""A model's state, and the variables behind it.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

try:  # keras/src/backend/common/variables.py (3.8-3.16)
    from keras.src.backend.common.variables import Variable as _KerasVariable
except ImportError:  # pragma: no cover - `_compat.platform` names it before a call
    _KerasVariable = None

from .compiled import compile_loss, compile_metrics, loss_tracker
from .patches import Patches

# A model's state, and the variables behind it ------------------------------------
#
# A Keras variable on the TensorFlow backend is a handle on a backing
# `tf.Variable`, its `_value` (keras/src/backend/tensorflow/ops/core.py, and
# backend/tensorflow/core.py before 3.16: `Variable._initialize`), which is what step functions capture and
# what tf.distribute distributes. `trainer.model.placement` swaps it to move a model
# into a strategy's scope. Keras's TF optimizer remembers the strategy it was
# made under (`TFOptimizer._distribution_strategy`) and updates variables
# through it, and indexes its variables by the backing variable
# (`_var_key`, `_trainable_variables_indices`; 3.8-3.16).


def backing(variable: keras.Variable) -> Any:
    """The `tf.Variable` behind a Keras variable (None before it is initialized)."""
    return getattr(variable, "_value", None)


def set_backing(variable: keras.Variable, value: tf.Variable) -> None:
    variable._value = value


# int() and float() of a scalar Keras variable read its backing (`KerasVariable.__int__`, `__float__`; 3.8-3.16),
# and a MirroredVariable has neither, though its numpy() reads the value the replicas agree on. While a model is
# in a strategy's scope for a call, a callback's `int(model.some_counter)` reads as on one device.
_SCALAR_ORIGINALS: dict[str, Any] = {}


def _read_as(name: str, convert: Any) -> Any:
    def method(self):
        if self.ndim == 0 and isinstance(backing(self), tf.distribute.DistributedValues):
            return convert(self.numpy())
        return _SCALAR_ORIGINALS[name](self)

    return method


_WHERE = "Variable (keras/src/backend/common/variables.py)"
_SCALAR_READS = Patches("a callback's int() and float() of a scalar variable",
                        [("int", _KerasVariable, "__int__", _read_as("int", int), _WHERE),
                         ("float", _KerasVariable, "__float__", _read_as("float", float), _WHERE)], _SCALAR_ORIGINALS)


def scalar_reads():
    """While inside: `int()` and `float()` of a scalar Keras variable in a strategy's scope work as on one device."""
    return _SCALAR_READS.installed()


def optimizer_strategy(optimizer: Any) -> Any:
    """The strategy a Keras optimizer updates variables through (None for a non-TF optimizer)."""
    return getattr(optimizer, "_distribution_strategy", None)


def set_optimizer_strategy(optimizer: Any, strategy: tf.distribute.Strategy) -> None:
    if hasattr(optimizer, "_distribution_strategy"):
        optimizer._distribution_strategy = strategy


def schedule_of(optimizer: Any) -> Any:
    """The schedule object an optimizer was given (`learning_rate` reads its current value instead)."""
    return optimizer._learning_rate


def reindex(optimizer: Any) -> None:
    """Rebuilds the optimizer's index of its variables, which is keyed by their backing variables, and (Keras 3.16)
    its record of which of them decay, by the same keys.

    The index is a new dict: the optimizer tracks the old one in a wrapper that TensorFlow's SavedModel
    refuses to save once the dict is changed past it (its `clear()` is not intercepted), which broke
    `model.export` after a call on replicas.
    """
    variables = getattr(optimizer, "_trainable_variables", None)
    index = getattr(optimizer, "_trainable_variables_indices", None)
    if variables is None or index is None or not getattr(optimizer, "built", False):
        return
    keys = {i: key for key, i in index.items()}  # the old keys, by variable
    optimizer._trainable_variables_indices = {optimizer._var_key(v): i for i, v in enumerate(variables)}
    # From Keras 3.16 which variables decay is decided at build time, in a dict by the same keys
    # (`_weight_decay_by_var_key`; `_use_weight_decay` reads it).
    decays = getattr(optimizer, "_weight_decay_by_var_key", None)
    if decays is not None:
        optimizer._weight_decay_by_var_key = {optimizer._var_key(v): decays[keys[i]] for i, v in enumerate(variables)
                                             if keys.get(i) in decays}


def forget_traced_functions(model: keras.Model) -> None:
    """Drops the functions Keras's own fit, evaluate and predict traced: they captured the backing variables."""
    for layer in all_layers(model):
        for name in ("train_function", "test_function", "predict_function"):
            if getattr(layer, name, None) is not None:
                setattr(layer, name, None)


def model_state(model: keras.Model) -> tuple[list, list]:
    """(every Keras variable the model holds, every optimizer it holds), each once, in a fixed order.

    The layers' weights and seed states, the metrics' variables (compiled ones,
    the loss tracker, a layer's own), and every optimizer's: `model.optimizer`
    and any other one that the model or one of its layers holds as an
    attribute, alone or in a list or dict (a GAN's two).
    """
    optimizers: list = []
    variables: dict[int, Any] = {}

    def add_optimizer(optimizer):
        if optimizer is not None and all(optimizer is not o for o in optimizers):
            optimizers.append(optimizer)
            add_optimizer(getattr(optimizer, "inner_optimizer", None))

    def add(values):
        for v in values:
            if isinstance(v, keras.Variable):
                variables.setdefault(id(v), v)

    add(model.variables)
    metrics = list(model.metrics)
    for layer in all_layers(model):
        metrics += list(getattr(layer, "_metrics", None) or [])  # tracked, even where `metrics` is overridden
    metrics += [m for m in (loss_tracker(model), compile_metrics(model)) if m is not None]
    metrics += list(getattr(compile_loss(model), "metrics", None) or [])
    for metric in metrics:
        add(metric.variables)
    add_optimizer(getattr(model, "optimizer", None))
    for layer in all_layers(model):
        for value in vars(layer).values():
            for item in _held(value):
                if isinstance(item, keras.optimizers.Optimizer):
                    add_optimizer(item)
    for optimizer in optimizers:
        add(optimizer.variables)
    return list(variables.values()), optimizers


def _held(value: Any) -> list:
    """What an attribute holds: the items of a list, tuple or dict, else the value itself."""
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, (list, tuple)) else [value]


def build_model_only(model: keras.Model, x: Any) -> None:
    """Creates the model's own variables from the shapes of `x`, symbolically (no op runs), as
    `Model._symbolic_build` does."""
    from keras.src import backend as _backend  # keras/src/backend (3.0-3.16): compute_output_spec

    def symbolic(t):
        return None if t is None else keras.KerasTensor(t.shape, keras.backend.standardize_dtype(t.dtype))

    _backend.compute_output_spec(model, keras.tree.map_structure(symbolic, x), training=False)


def step_counter(optimizer) -> Any:
    """The variable that counts `apply` calls; `optimizer.iterations` divides it by the accumulation steps."""
    return getattr(optimizer, "_iterations", optimizer.iterations)


def sublayers(model) -> list:
    """The layers directly inside `model`: a `keras.Model`'s `layers`; for a layer that mixes in Keras's trainer
    (no `layers`), the layers it tracks (`Layer._flatten_layers`, 3.0-3.16)."""
    layers = getattr(model, "layers", None)
    if layers is not None:
        return list(layers)
    return list(model._flatten_layers(include_self=False, recursive=False))


def seed_states(model: Any) -> list:
    """The state variables of the SeedGenerators that `model` and its layers hold (`Layer._seed_generators`,
    3.0-3.16), each once."""
    states, seen = [], set()
    for layer in all_layers(model):
        for generator in getattr(layer, "_seed_generators", ()):
            if id(generator.state) not in seen:
                seen.add(id(generator.state))
                states.append(generator.state)
    return states


def all_layers(model: keras.Model) -> list:
    """The model and every layer inside it, nested ones included (`Layer._flatten_layers`, 3.0-3.16)."""
    flatten = getattr(model, "_flatten_layers", None)
    if flatten is not None:
        return list(flatten(include_self=True, recursive=True))
    found = [model]  # pragma: no cover - the public, shallower walk
    for layer in getattr(model, "layers", []):
        found += all_layers(layer) if isinstance(layer, keras.Model) else [layer]
    return found
