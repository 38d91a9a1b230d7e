"""A Keras model built anywhere, moved into a strategy's scope in place for one call, and back.

`move_in` gives each variable a backing made in the scope from its value; `Move.back` returns every one to its
home with the trained value, so the model then works without any strategy, as after `model.fit`. Nothing is
re-created: layers, losses, metrics and optimizers stay the user's own objects. How, strategy by strategy:
docs/design.md, "The model and optimizer in scope".
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import keras
import numpy as np
import tensorflow as tf

from trainer import _compat
from trainer.distribute.cluster import is_parameter_server, strategy_cluster_info
from trainer.model.own_steps import overridden

ON_READ = tf.VariableSynchronization.ON_READ


@dataclasses.dataclass
class Backings:
    """The in-scope backings made for one model under one strategy, kept by the Trainer between calls.

    `inside`: id(Keras variable) -> (the variable, its in-scope backing).
    """

    inside: dict[int, tuple[keras.Variable, Any]] = dataclasses.field(default_factory=dict)


def in_scope(strategy: tf.distribute.Strategy, backing: Any) -> bool:
    """Whether a backing variable belongs to `strategy` (any plain variable belongs to the default one)."""
    return strategy.extended.variable_created_in_scope(backing)


@dataclasses.dataclass
class Move:
    """A model in `strategy`'s scope for one call; `back()` puts it home.

    Attributes:
      homes: id(Keras variable) -> (the variable, the backing it had before the move).
      stay: ids of the variables that were in the scope before the move (they stay there).
      optimizer_strategies: each moved optimizer with the strategy it updated through before.
      table: the Trainer's in-scope backings for this model and strategy.
      undo: what the call changed on the model for its duration (a scaled learning rate), undone first.
    """

    model: keras.Model
    strategy: tf.distribute.Strategy
    homes: dict[int, tuple[keras.Variable, Any]]
    optimizer_strategies: list[tuple[Any, Any]]
    table: Backings
    stay: set[int] = dataclasses.field(default_factory=set)
    undo: list[Callable[[], None]] = dataclasses.field(default_factory=list)
    reads: contextlib.ExitStack = dataclasses.field(default_factory=contextlib.ExitStack)

    def describe(self) -> str:
        """For the plan: what moved, in words ("" when the model was in the scope already)."""
        if not self.homes:
            return ""
        sharded = sum(_compat.is_sharded(_compat.backing(variable)) for variable, _ in self.homes.values())
        split = f", {sharded} of them split over the ps tasks by the variable_partitioner," if sharded else ""
        return (f"your {type(self.model).__name__}, built outside the strategy's scope: its {len(self.homes)} "
                f"variables (weights, optimizer and metric state) train in place in the scope{split} and go back "
                "after the call; nothing is re-created")

    def __enter__(self) -> Move:
        self.reads.enter_context(_compat.scalar_reads())  # a callback's int(variable) reads as on one device
        return self

    def __exit__(self, error_type, error, traceback) -> None:
        try:
            self.back(local=error is not None)
        finally:
            self.reads.close()

    def back(self, local: bool = False) -> None:
        """Every variable in the scope returns home with its value; the model is then as `model.fit` leaves it.

        With `local`, after an error, values are read from this process's own
        copies, with no collective: a peer worker may be gone, and waiting on
        it would hide the error. A metric's total summed over workers then
        comes home with this worker's part only.
        """
        while self.undo:
            self.undo.pop()()
        if not self.homes and not self.optimizer_strategies:
            return
        variables, optimizers = _compat.model_state(self.model)
        for variable in variables:
            current = _compat.backing(variable)
            if current is None or id(variable) in self.stay or not in_scope(self.strategy, current):
                continue
            _, home = self.homes.get(id(variable), (None, None))
            if home is None:  # created in the scope during the call
                with tf.init_scope():
                    home = _variable_like(current, variable.name, one_device_value(current, local))
            else:
                fill(home, one_device_value(current, local), first_holds_sum=True)
            self.table.inside[id(variable)] = (variable, current)
            _compat.set_backing(variable, home)
        before = {id(optimizer): previous for optimizer, previous in self.optimizer_strategies}
        for optimizer in optimizers:
            if _compat.optimizer_strategy(optimizer) is self.strategy:
                _compat.set_optimizer_strategy(optimizer, before.get(id(optimizer), tf.distribute.get_strategy()))
            _compat.reindex(optimizer)
        _compat.forget_traced_functions(self.model)
        self.homes, self.optimizer_strategies = {}, []


def move_in(model: keras.Model, strategy: tf.distribute.Strategy, table: Backings, data_batch: Any, *,
            targets: bool) -> Move:
    """Builds what `model` has not built yet and puts every variable it holds in `strategy`'s scope.

    A model already in the scope (built there, or by a builder) is built in
    it and stays; any other is built where it lives, then moved.

    Args:
      table: the in-scope backings made for this model and strategy by earlier calls (filled here).
      data_batch: a sample `(x, y, sample_weight)` batch (or `x`) whose shapes build the model.
      targets: build the compiled losses and metrics too (fit and evaluate), not only the model (predict).
    """
    variables, _ = _compat.model_state(model)
    if _all_in_scope(variables, strategy):
        with strategy.scope():
            build(model, data_batch, targets=targets)
        return Move(model, strategy, {}, [], table)
    with _home_scope(variables):
        build(model, data_batch, targets=targets)
    variables, optimizers = _compat.model_state(model)
    move = Move(model, strategy, {}, [], table,
                stay={id(v) for v in variables
                      if _compat.backing(v) is not None and in_scope(strategy, _compat.backing(v))})
    try:
        _move_variables(move, variables)
        move.optimizer_strategies = [(optimizer, _compat.optimizer_strategy(optimizer)) for optimizer in optimizers]
        for optimizer in optimizers:
            _compat.set_optimizer_strategy(optimizer, strategy)
            _compat.reindex(optimizer)
        _compat.forget_traced_functions(model)
    except BaseException:
        move.back(local=True)  # nothing half-moved is left behind
        raise
    return move


def _move_variables(move: Move, variables: list) -> None:
    """Gives each variable outside the scope an in-scope backing holding its value (kept in `move.table`)."""
    strategy = move.strategy
    first_holds_sum = strategy_cluster_info(strategy).is_chief
    for variable in variables:
        home = _compat.backing(variable)
        if home is None or id(variable) in move.stay:
            continue
        known_variable, inside = move.table.inside.get(id(variable), (None, None))
        value = one_device_value(home)
        if known_variable is variable and inside.shape == home.shape and inside.dtype == home.dtype:
            fill(inside, value, first_holds_sum)
        else:
            with strategy.scope(), tf.init_scope():
                inside = _variable_like(home, variable.name, value)
            if not _compat.is_sharded(inside) and inside.synchronization == ON_READ:
                fill(inside, value, first_holds_sum)
        move.homes[id(variable)] = (variable, home)
        _compat.set_backing(variable, inside)


def build(model: keras.Model, data_batch: Any, *, targets: bool) -> None:
    """Creates the state the model has not built yet, as Keras's fit does under a strategy before its first
    step (`Model._symbolic_build`): symbolically, so that nothing runs (a stateful RNN's states stay).

    A model with its own `train_step` need not be callable on `x` (a VAE or a conditional GAN may have no
    `call()` at all): what it has not built, its step builds, as under `model.fit` on one device, by tracing
    the step once where the model lives (the trace is never run: no update, no metric, no random draw).
    """
    # Tensors for NumPy arrays: Keras reads the dtypes it knows, and NumPy's strings are not one.
    data_batch = keras.tree.map_structure(lambda t: tf.convert_to_tensor(t) if isinstance(t, np.ndarray) else t,
                                          data_batch)
    own_step = targets and overridden(model, "train_step")
    unbuilt = not all(layer.built for layer in _compat.all_layers(model))
    if not targets:  # predict's batches are the features alone, as the model is called on them
        if unbuilt:
            _compat.build_model_only(model, data_batch)
        return
    if own_step and unbuilt:
        # What only the model's own step creates (the layers of a model without call(), an optimizer built in
        # its first apply), created as the first trace of the step under `model.fit` creates it, at home and
        # without running anything.
        tf.function(model.train_step).get_concrete_function(data_batch)
    try:
        _compat.symbolic_build(model, data_batch)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        if not own_step:
            raise
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)


def _home_scope(variables: list):
    """The scope of the strategy these variables belong to (the model was built in a user's
    `with strategy.scope():`), where what the model has not built yet must be made; none for variables made
    outside any, or while another strategy's scope is open (the call sits in it)."""
    for variable in variables:
        backing = _compat.backing(variable)
        if isinstance(backing, tf.distribute.DistributedValues):
            if not tf.distribute.has_strategy():
                return backing.distribute_strategy.scope()
            break
    return contextlib.nullcontext()


def _all_in_scope(variables: list, strategy: tf.distribute.Strategy) -> bool:
    return all(in_scope(strategy, _compat.backing(v)) for v in variables if _compat.backing(v) is not None)


def _variable_like(like: Any, name: str, value: Any) -> tf.Variable:
    """A variable made in the current scope with `like`'s dtype, trainable flag, aggregation and
    synchronization, holding `value`."""
    return tf.Variable(value, dtype=like.dtype, trainable=like.trainable, name=name, aggregation=like.aggregation,
                       synchronization=like.synchronization)


def one_device_value(variable: Any, local: bool = False) -> tf.Tensor:
    """A variable's value as one device sees it: on-read variables summed or averaged over the replicas
    (with `local`, over this process's replicas only, with no collective)."""
    if _compat.is_sharded(variable):  # its shards, put together
        return tf.convert_to_tensor(variable)
    if not isinstance(variable, tf.distribute.DistributedValues):
        return variable.read_value()
    parts = variable.distribute_strategy.experimental_local_results(variable)
    if variable.synchronization != ON_READ:
        return parts[0].read_value() if local else variable.read_value()
    if variable.aggregation in (tf.VariableAggregation.NONE, tf.VariableAggregation.ONLY_FIRST_REPLICA):
        return parts[0].read_value()
    if not local:
        return variable.read_value()
    total = tf.add_n([part.read_value() for part in parts])
    return total / len(parts) if variable.aggregation == tf.VariableAggregation.MEAN else total


def fill(target: Any, value: Any, first_holds_sum: bool) -> None:
    """Puts `value` in a variable so that it reads back as `value`, one local copy at a time.

    A distributed on-read variable summed over replicas (a metric's total)
    holds it in the first copy (the chief's, across workers) and zeros
    elsewhere; any other holds it in every copy. The copies are assigned
    directly: a MirroredVariable's own `assign` goes through the strategy's
    update machinery, a millisecond or two per variable in eager mode, and
    every worker fills its copies with the same values.
    """
    if not isinstance(target, tf.distribute.DistributedValues) or is_parameter_server(target.distribute_strategy):
        target.assign(value)
        return
    summed = target.synchronization == ON_READ and target.aggregation == tf.VariableAggregation.SUM
    for i, part in enumerate(target.distribute_strategy.experimental_local_results(target)):
        part.assign(value if not summed or (i == 0 and first_holds_sum) else tf.zeros_like(value))
