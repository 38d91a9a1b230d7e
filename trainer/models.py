"""Puts the user's model and optimizer inside a strategy's scope.

Variables belong to the strategy under whose scope they were created. A model
or optimizer built elsewhere is re-created inside the scope from its config,
keeping weights, optimizer settings and state, loss and metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any, Callable

import keras
import tensorflow as tf

from trainer import _compat, scaling
from trainer.objective import overridden

ModelOrBuilder = keras.Model | Callable[[], keras.Model]


@dataclasses.dataclass(frozen=True)
class Scaled:
    """An optimizer the trainer made: the learning rate it was tuned with, and the scaling it got."""

    base_lr: Any  # a float, or the user's schedule
    strategy: tf.distribute.Strategy
    factor: float
    warmup_steps: int


class InScope:
    """What one Trainer made inside strategies' scopes for the user's objects, so that later calls reuse it.

    - `copies`: user model -> its in-scope copy, with what it was copied from
      (`_compiled_as`); reused, optimizer state included, until the user
      recompiles the model or changes what is trainable.
    - `scaled`: optimizer the trainer made -> `Scaled`, so that a second fit
      never scales twice.

    Keys are weak: the Trainer never keeps a user's model or optimizer alive.
    """

    def __init__(self):
        self.copies: "weakref.WeakKeyDictionary[keras.Model, tuple[keras.Model, tuple]]" = \
            weakref.WeakKeyDictionary()
        self.scaled: "weakref.WeakKeyDictionary[keras.optimizers.Optimizer, Scaled]" = weakref.WeakKeyDictionary()


def check_compiled(model: Any, arg: str = "model") -> None:
    """Raises unless `model` is a Keras model compiled for training as `model.fit` needs it.

    A model with its own `train_step` needs only `compile()` to have been
    called (a GAN compiles its own optimizers); any other needs an optimizer,
    and a loss (`check_loss`).
    """
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"`{arg}` must be a keras.Model or a zero-argument function returning one. "
            f"Received: {arg} of type {type(model).__name__}."
        )
    needs = [] if overridden(model, "train_step") else ["an optimizer"]  # the loss: `check_loss`, once built
    missing = [need for need in needs if getattr(model, "optimizer", None) is None]
    if getattr(model, "compiled", False) and not missing:
        return
    got = f"a {type(model).__name__} compiled without {' or '.join(missing)}" if getattr(model, "compiled", False) \
        else f"an uncompiled {type(model).__name__}"
    raise ValueError(
        f"`{arg}` must be compiled{' with ' + ' and '.join(needs) if needs else ''}. Received: {got}. "
        "Call model.compile(optimizer=..., loss=...) first (a model with its own train_step or compute_loss "
        "may leave out what its step does not use)."
    )


def check_loss(model: keras.Model, *, training: bool) -> None:
    """A model that the trainer's own step trains or evaluates needs a loss: compiled, or added by its layers.

    Keras takes `compile(optimizer)` without a loss for a model whose layers
    call `add_loss` (known once the model has run); with neither, its step
    fails on the first batch.
    """
    step = "train_step" if training else "test_step"
    if overridden(model, step) or overridden(model, "compute_loss") or getattr(model, "loss", None) is not None:
        return
    if model.losses:
        return
    raise ValueError(
        f"`model` must be compiled with a loss, or have layers that add one (add_loss): it has neither, so "
        f"there is nothing to {'train on' if training else 'evaluate'}. Received: a {type(model).__name__} "
        "compiled with loss=None. Call model.compile(optimizer=..., loss=...)."
    )


def _in_scope(strategy: tf.distribute.Strategy, variables) -> bool:
    return all(strategy.extended.variable_created_in_scope(v.value) for v in variables)


def from_builder(model: ModelOrBuilder, strategy: tf.distribute.Strategy, seed: int | None,
                 mixed_precision: str | None = None) -> keras.Model:
    """A builder's compiled model, made in `strategy`'s scope after seeding Keras; a model as it is.

    Seeding makes a builder's initial weights reproducible; the user's global
    random generators are left as they were (`_compat.seeded`).
    """
    if isinstance(model, keras.Model):
        return model
    with strategy.scope(), _dtype_policy(mixed_precision), _compat.seeded(seed):
        model = model()
    check_compiled(model, arg="model()")
    return model


def model_in_scope(
    model: keras.Model,
    strategy: tf.distribute.Strategy,
    sample_x: Any,
    in_scope: InScope,
    mixed_precision: str | None = None,
) -> keras.Model:
    """Returns a compiled, built model whose variables live in `strategy`'s scope.

    A model built elsewhere, or with another dtype policy than
    `mixed_precision` asks for, is re-created from its config; the returned
    object is then a different one from `model`.
    """
    if model.weights and not _ready(model, strategy, mixed_precision):
        clone, copied_from = in_scope.copies.get(model, (None, None))
        compiled_as = _compiled_as(model)
        if clone is not None and _ready(clone, strategy, mixed_precision) and copied_from == compiled_as:
            clone.set_weights(model.get_weights())  # the user's object holds the latest weights
            return clone
        clone = _recreate(model, strategy, sample_x, mixed_precision)
        in_scope.copies[model] = clone, compiled_as
        model = clone
    with strategy.scope():
        model(sample_x, training=False)  # creates any variables not built yet
    return model


def fixed_batch_size(model: keras.Model) -> int | None:
    """The batch size that the model's inputs declare (`keras.Input(batch_shape=...)`), or None."""
    try:
        inputs = model.inputs or []
    except (AttributeError, ValueError):  # a subclassed model has no symbolic inputs
        return None
    return next((t.shape[0] for t in inputs if t.shape[0] is not None), None)


def stateful_layers(model: keras.Model) -> list[keras.layers.Layer]:
    """The layers that keep a state per batch row from one call to the next (stateful RNNs)."""
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found += stateful_layers(layer)
        elif getattr(layer, "stateful", False) or getattr(getattr(layer, "forward_layer", None), "stateful", False):
            found.append(layer)
    return found


def per_replica_batch_norm(model: keras.Model) -> list[str]:
    """The BatchNormalization layers that normalize each replica's share by its own statistics."""
    names = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            names += per_replica_batch_norm(layer)
        elif isinstance(layer, keras.layers.BatchNormalization) and not getattr(layer, "synchronized", False):
            names.append(layer.name)
    return names


def _state_variables(model: keras.Model) -> list:
    layers = stateful_layers(model)
    for wrapper in [layer for layer in layers if hasattr(layer, "forward_layer")]:
        layers += [wrapper.forward_layer, wrapper.backward_layer]
    return [v for layer in layers for v in (getattr(layer, "states", None) or []) if v is not None]


def saved_states(model: keras.Model) -> list[tuple[Any, Any]]:
    """The states of `model`'s stateful layers, for `restore_states`."""
    return [(v, v.numpy()) for v in _state_variables(model)]


def restore_states(model: keras.Model, saved: list[tuple[Any, Any]]) -> None:
    """Undoes what calls that built `model` did to the states of its stateful layers.

    The trainer calls a model on a sample batch to build it, which a stateful
    RNN takes as a step: its states move on. Keras's `fit` builds symbolically,
    so training starts from the states as they were (`saved`), or from zeros
    for states the calls created (in a copy of the model, say).
    """
    for variable in _state_variables(model):
        variable.assign(next((value for v, value in saved if v is variable), tf.zeros_like(variable)))


def _compiled_as(model: keras.Model) -> tuple:
    """What a copy of `model` takes from it besides weights: optimizer, compile settings, trainable flags.

    Fine-tuning changes these between fits (unfreeze layers, recompile with a
    lower learning rate); a copy made before must then be made again.
    """
    compile_config = model.get_compile_config() if model.compiled else None
    return model.optimizer, compile_config, tuple(v.trainable for v in model.weights)


def _ready(model: keras.Model, strategy: tf.distribute.Strategy, mixed_precision: str | None) -> bool:
    # A model that keeps some layers in float32 on purpose (an output head, say) is ready too.
    return _in_scope(strategy, model.weights) and (mixed_precision is None
                                                    or mixed_precision in layer_policies(model))


def layer_policies(model: keras.Model) -> frozenset[str]:
    """The dtype policies that the model's layers with weights compute in.

    Read from the layers, not the model: Keras reloads a Sequential with float32
    as the container's own policy while its layers keep theirs.
    """
    policies = frozenset(layer.dtype_policy.name for layer in _weighted_layers(model))
    return policies or frozenset({model.dtype_policy.name})


def precision(model: keras.Model) -> str:
    """`layer_policies` in words: one policy name, or "a+b" when they differ."""
    return "+".join(sorted(layer_policies(model)))


def _weighted_layers(model: keras.Model):
    for layer in model.layers:
        inner = list(_weighted_layers(layer)) if isinstance(layer, keras.Model) else []
        if inner:
            yield from inner
        elif layer.weights:
            yield layer


@contextlib.contextmanager
def _dtype_policy(policy: str | None):
    """Keras's global dtype policy set to `policy` (if any) while layers are created."""
    previous = keras.config.dtype_policy()
    if policy:
        keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _with_policy(config: Any, policy: str | None) -> Any:
    """A model config whose float32 layers compute in `policy` (variables stay float32)."""
    if policy is None:
        return config
    if isinstance(config, dict) and config.get("class_name") == "DTypePolicy":
        return dict(config, config=dict(config["config"], name=policy))
    if isinstance(config, dict):
        return {k: _with_policy(v, policy) for k, v in config.items()}
    if isinstance(config, list):
        return [_with_policy(v, policy) for v in config]
    return config


# Layers whose state is not in their weights (an adapted vocabulary lives in a lookup table),
# so a copy made from config and weights would lose it.
TABLE_LAYERS = ("TextVectorization", "StringLookup", "IntegerLookup")


def _table_layers(model: keras.Model) -> list[keras.layers.Layer]:
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found += _table_layers(layer)
        elif type(layer).__name__ in TABLE_LAYERS:
            found.append(layer)
    return found


def _recreate(
    model: keras.Model, strategy: tf.distribute.Strategy, sample_x: Any, mixed_precision: str | None = None
) -> keras.Model:
    tables = _table_layers(model)
    if tables:
        names = ", ".join(f"{layer.name} ({type(layer).__name__})" for layer in tables)
        raise ValueError(
            f"`model` was built outside the strategy's scope, and its layer(s) {names} keep their vocabulary in "
            "a lookup table, not in weights, so a copy made inside the scope would lose it. Pass a function "
            "that builds, adapts and compiles the model instead: Trainer.fit(lambda: make_model(), ...); or "
            "build the model inside `strategy.scope()`."
        )
    if model.optimizer is not None and overridden(model, "compile"):
        raise ValueError(
            f"`model` was built outside the strategy's scope, and {type(model).__name__} has its own compile() "
            "(a GAN's compile(d_optimizer=..., g_optimizer=...), say), whose arguments the trainer cannot know to "
            "compile a copy inside the scope. Pass a function that builds and compiles the model instead: "
            "Trainer.fit(lambda: make_model(), ...); or build and compile it inside `strategy.scope()`."
        )
    if mixed_precision in layer_policies(model):
        mixed_precision = None  # already in it: any layers kept in float32 (a head) stay so
    # The model's own layer classes, so that custom layers need no registration with Keras.
    classes = {type(layer).__name__: type(layer) for layer in _compat.all_layers(model)}
    try:
        config = _with_policy(model.get_config(), mixed_precision)
        # Layers draw their seeds from Python's `random`; the copy's weights come from `model`.
        with strategy.scope(), _dtype_policy(mixed_precision), keras.saving.custom_object_scope(classes), \
                _compat.global_random_state_kept():
            clone = model.__class__.from_config(config)
            clone(sample_x, training=False)
    except (NotImplementedError, TypeError, ValueError) as err:
        custom = sorted(name for name, cls in classes.items() if not cls.__module__.startswith("keras."))
        raise ValueError(
            f"`model` was built outside the strategy's scope and can't be re-created inside "
            f"it: {type(model).__name__}.get_config()/from_config() failed ({_first_line(err)}). Give "
            f"{'each custom class (' + ', '.join(custom) + ')' if custom else 'it'} a get_config() that returns "
            "its __init__ arguments, or pass a function that builds and compiles the model instead: "
            "Trainer.fit(lambda: make_model(), ...)."
        ) from err
    clone.set_weights(model.get_weights())
    if model.optimizer is None:  # predict-only use
        return clone
    specs = _compat.compiled_specs(model)
    with strategy.scope():  # compile creates Keras's own trackers
        clone.compile(
            optimizer=model.optimizer,  # replaced in scope by `optimizer_in_scope`
            loss=specs["loss"],
            loss_weights=specs["loss_weights"],
            metrics=_fresh_metrics(specs["metrics"]),
            weighted_metrics=_fresh_metrics(specs["weighted_metrics"]),
        )
    return clone


def _fresh_metrics(spec: Any) -> Any:
    """The user's compiled metrics with each metric object copied (its variables live outside the scope).

    Copied through the class's own `from_config`, which needs no registration
    with Keras; names, strings and functions are kept as they are.
    """
    if isinstance(spec, keras.metrics.Metric):
        return type(spec).from_config(spec.get_config())
    if isinstance(spec, dict):
        return {k: _fresh_metrics(v) for k, v in spec.items()}
    if isinstance(spec, (list, tuple)):
        return [_fresh_metrics(s) for s in spec]
    return spec


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"


# Set on each optimizer the trainer scales, so that another Trainer refuses it rather than scaling twice.
_SCALED_BY_A_TRAINER = "_scaled_by_trainer"


def base_learning_rate(optimizer: keras.optimizers.Optimizer, in_scope: InScope) -> Any:
    """The unscaled learning rate: a float, or the user's schedule."""
    if optimizer in in_scope.scaled:
        return in_scope.scaled[optimizer].base_lr
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    lr = optimizer.get_config()["learning_rate"]
    if not isinstance(lr, dict):
        if getattr(optimizer, _SCALED_BY_A_TRAINER, False):
            raise ValueError(
                "`model.optimizer` was made by another Trainer, with its learning rate scaled for that Trainer's "
                f"replicas ({float(lr):.4g} now), and this Trainer can't know the rate it was tuned with, so it "
                "would scale it twice. Received: a model trained by another Trainer. Train it with that Trainer, "
                "or recompile it with the learning rate as tuned: model.compile(optimizer=..., ...)."
            )
        return float(lr)
    schedule = keras.saving.deserialize_keras_object(lr)
    # A checkpoint of a scaled run: its schedule is ours, so the user's is inside it.
    return schedule.base if isinstance(schedule, scaling.ScaledSchedule) else schedule


def optimizer_in_scope(
    model: keras.Model,
    strategy: tf.distribute.Strategy,
    in_scope: InScope,
    *,
    factor: float,
    warmup_steps: int,
    own_model: bool,
) -> keras.optimizers.Optimizer:
    """Returns `model.optimizer`, ready for `strategy`, with its LR scaled by `factor`.

    Where nothing is scaled, the model is the user's own (`own_model`, not an
    in-scope copy) and its optimizer can live in `strategy`'s scope (not built
    yet, or built there), the optimizer object is kept as it is, as `model.fit`
    keeps it. Else `model.optimizer` is set to one built in scope, with the
    state of the old one: an optimizer already prepared for this strategy and
    scaling is kept, state and any LR changes made by callbacks included. A
    float16 model gets Keras's dynamic loss scaling (`LossScaleOptimizer`),
    which float16 gradients need to stay out of the underflow range.
    """
    old = model.optimizer
    needs_loss_scale = ("mixed_float16" in layer_policies(model)
                        and not isinstance(old, keras.optimizers.LossScaleOptimizer))
    if factor == 1.0 and own_model and not needs_loss_scale and old not in in_scope.scaled and (
            not old.built or _in_scope(strategy, old.variables)):
        if not old.built:
            with strategy.scope():
                old.build(model.trainable_variables)
        return old
    scaled_for = in_scope.scaled.get(old)
    if scaled_for and scaled_for.strategy is strategy and (scaled_for.factor, scaled_for.warmup_steps) == (
            factor, warmup_steps):
        return old
    base = base_learning_rate(old, in_scope)
    # A LossScaleOptimizer (ours, or compile's for a float16 model) is re-created around its inner one.
    inner = old.inner_optimizer if isinstance(old, keras.optimizers.LossScaleOptimizer) else old
    if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
        lr = scaling.ScaledSchedule(base, factor, warmup_steps)
    else:
        lr = base * factor  # a float keeps `optimizer.learning_rate` settable
    config = dict(inner.get_config(), learning_rate=lr)
    with strategy.scope():
        new = inner.__class__.from_config(config)
        new.build(model.trainable_variables)
        if inner.built:
            _copy_state(inner, new)
        if "mixed_float16" in layer_policies(model):
            new = keras.optimizers.LossScaleOptimizer(new)
            new.build(model.trainable_variables)
    in_scope.scaled[new] = Scaled(base, strategy, factor, warmup_steps)
    for made in (new, getattr(new, "inner_optimizer", None)):
        if made is not None and factor != 1.0:
            setattr(made, _SCALED_BY_A_TRAINER, True)
    model.optimizer = new
    return new


def _copy_state(old: keras.optimizers.Optimizer, new: keras.optimizers.Optimizer) -> None:
    """Copies iterations and slots (not the learning rate, which was just scaled)."""
    old_vars = [v for v in old.variables if v is not old.learning_rate]
    new_vars = [v for v in new.variables if v is not new.learning_rate]
    if len(old_vars) != len(new_vars):
        return  # a different structure: start the optimizer afresh
    for source, target in zip(old_vars, new_vars):
        target.assign(source.value)
