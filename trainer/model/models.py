"""The user's model and optimizer for a strategy: checks, builders, dtype policies, the scaled optimizer.

How a model built elsewhere enters the strategy's scope is `trainer.model.placement`.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable

import keras
import tensorflow as tf

from trainer import _compat, scaling
from trainer.model.own_steps import overridden
from trainer.model.placement import Backings

ModelOrBuilder = keras.Model | Callable[[], keras.Model]


class InScope:
    """What one Trainer made inside strategies' scopes for the user's objects, so that later calls reuse it.

    - `backings`: user model -> for each strategy it was moved into, the
      in-scope backing variables made for its variables (`trainer.model.placement`),
      filled again by the next call so that the steps traced on them are reused.
    - `jit_asked`: model -> the `jit_compile` its `compile` was given (True, False or "auto"), for the models
      compiled while the Trainer called a builder or ran a `Trainer.distribute()` block (`_compat.compile_noted`).

    Keys are weak: the Trainer never keeps a user's model alive.
    """

    def __init__(self):
        self.backings: "weakref.WeakKeyDictionary[keras.Model, list[tuple[tf.distribute.Strategy, Backings]]]" = \
            weakref.WeakKeyDictionary()
        self.jit_asked: "weakref.WeakKeyDictionary[keras.Model, bool | str]" = weakref.WeakKeyDictionary()

    def table(self, model: keras.Model, strategy: tf.distribute.Strategy) -> Backings:
        """The in-scope backings of `model`'s variables under `strategy`."""
        tables = self.backings.setdefault(model, [])
        for known, table in tables:
            if known is strategy:
                return table
        tables.append((strategy, Backings()))
        return tables[-1][1]


def check_compiled(model: Any, arg: str = "model") -> None:
    """Raises unless `model` is a Keras model compiled for training as `model.fit` needs it.

    A model with its own `train_step` needs only `compile()` to have been
    called (a GAN compiles its own optimizers); any other needs an optimizer,
    and a loss (`check_loss`).
    """
    if not _compat.is_model(model):
        raise TypeError(
            f"`{arg}` must be a keras.Model or a zero-argument function returning one. "
            f"Received: {arg} of type {type(model).__name__}."
        )
    needs = [] if overridden(model, "train_step") else ["an optimizer"]  # the loss: `check_loss`, once built
    missing = [need for need in needs if getattr(model, "optimizer", None) is None]
    if getattr(model, "compiled", False) and not missing:
        return
    compiled = getattr(model, "compiled", False)
    got = f"a {type(model).__name__} compiled without {' or '.join(missing)}" if compiled \
        else f"an uncompiled {type(model).__name__}"
    raise ValueError(
        ("" if compiled else "You must call `compile()` before using the model. ")  # Keras's own words first
        + f"`{arg}` must be compiled{' with ' + ' and '.join(needs) if needs else ''}. Received: {got}. "
        "Call model.compile(optimizer=..., loss=...) first (a model with its own train_step or compute_loss "
        "may leave out what its step does not use)."
    )


def check_loss(model: keras.Model, x: Any, *, training: bool) -> None:
    """A model that the trainer's own step trains or evaluates needs a loss: compiled, or added by its layers.

    Keras takes `compile(optimizer)` without a loss for a model whose layers
    call `add_loss`; with neither, its step fails on the first batch. Whether
    the layers add one is known only by running the model: on `x`, a sample
    batch, in a stateless scope, so that no variable changes (it is checked
    before anything else is built).
    """
    step = "train_step" if training else "test_step"
    if overridden(model, step) or overridden(model, "compute_loss") or getattr(model, "loss", None) is not None:
        return
    if model.losses:  # weight regularizers
        return
    with keras.StatelessScope(collect_losses=True) as scope:
        model(x, training=training)
    if scope.losses or model.losses:
        return
    raise ValueError(
        f"`model` must be compiled with a loss, or have layers that add one (add_loss): it has neither, so "
        f"there is nothing to {'train on' if training else 'evaluate'}. Received: a {type(model).__name__} "
        "compiled with loss=None. Call model.compile(optimizer=..., loss=...)."
    )


def from_builder(model: ModelOrBuilder, strategy: tf.distribute.Strategy, seed: int | None,
                 mixed_precision: str | None = None, in_scope: InScope | None = None) -> keras.Model:
    """A builder's compiled model, made in `strategy`'s scope after seeding Keras; a model as it is.

    Seeding makes a builder's initial weights reproducible; the user's global
    random generators are left as they were (`_compat.seeded`). What the
    builder's `compile` was given for XLA goes in `in_scope.jit_asked`.
    """
    if _compat.is_model(model):
        return model
    notes = in_scope.jit_asked if in_scope is not None else weakref.WeakKeyDictionary()
    with strategy.scope(), _dtype_policy(mixed_precision), _compat.seeded(seed), _compat.compile_noted(notes):
        model = model()
    check_compiled(model, arg="model()")
    return model


def check_precision(model: ModelOrBuilder, mixed_precision: str | None) -> None:
    """Raises unless a model instance already computes in the `mixed_precision` the Trainer asks for.

    A dtype policy is fixed when the layers are made; a builder is called
    under it (`from_builder`), a model instance is trained as it was built.
    """
    if mixed_precision is None or not _compat.is_model(model) or mixed_precision in layer_policies(model):
        return
    raise ValueError(
        f"`mixed_precision='{mixed_precision}'` applies to the layers a builder makes, and `model` was built "
        f"computing in {precision(model)}. Received: a {type(model).__name__} instance with "
        f"Trainer(mixed_precision='{mixed_precision}'). Pass a function that builds and compiles the model, which "
        f"the Trainer calls under that policy: Trainer.fit(lambda: make_model(), ...); or build the model after "
        f"keras.config.set_dtype_policy('{mixed_precision}'), or leave mixed_precision unset."
    )


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
    for layer in _compat.sublayers(model):
        if _compat.is_model(layer):
            found += stateful_layers(layer)
        elif getattr(layer, "stateful", False) or getattr(getattr(layer, "forward_layer", None), "stateful", False):
            found.append(layer)
    return found


def per_replica_batch_norm(model: keras.Model) -> list[str]:
    """The BatchNormalization layers that normalize each replica's share by its own statistics."""
    return [layer.name for layer in _batch_norms(model) if not layer.synchronized]


def global_batch_norm(model: keras.Model) -> int:
    """How many BatchNormalization layers normalize with the global batch's statistics on several replicas."""
    return sum(1 for layer in _batch_norms(model) if layer.synchronized)


def outputs_masked(model: keras.Model, data_batch: Any) -> bool:
    """Whether the model's outputs carry Keras masks, seen on a forward pass over `data_batch`'s features (a few
    examples, in inference mode; a model that keeps a state, or that this call fails on, counts as unmasked)."""
    if stateful_layers(model):
        return False
    try:
        outputs = model(keras.utils.unpack_x_y_sample_weight(data_batch)[0], training=False)
    except Exception:  # noqa: BLE001 (a model without call(): its own steps run it)
        return False
    return any(_compat.get_keras_mask(t) is not None for t in tf.nest.flatten(outputs))


def synchronize_batch_norm(model: keras.Model) -> Callable[[], None]:
    """Gives every BatchNormalization layer of `model` the global batch's statistics for one call; returns
    what puts the layers back as they were.

    Keras's `synchronized=True` all-reduces each replica's sum, sum of squares
    and count, so the mean and variance are those of the global batch, whatever
    each replica's share of it: the one-device statistics. The layers read it
    when the step is traced.
    """
    layers = [layer for layer in _batch_norms(model) if not layer.synchronized]
    for layer in layers:
        layer.synchronized = True

    def restore():
        for layer in layers:
            layer.synchronized = False

    return restore


def _batch_norms(model: keras.Model) -> list:
    return [layer for layer in _compat.all_layers(model) if isinstance(layer, keras.layers.BatchNormalization)]


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
    for layer in _compat.sublayers(model):
        inner = list(_weighted_layers(layer)) if _compat.is_model(layer) else []
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


def base_learning_rate(optimizer: keras.optimizers.Optimizer) -> Any:
    """The learning rate as tuned: a float, or the user's schedule.

    Between calls the trainer leaves every optimizer at its unscaled rate
    (`scale_learning_rate`), and checkpoints save it so (`scaling.unscaled_learning_rate`).
    """
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    lr = optimizer.get_config()["learning_rate"]
    if not isinstance(lr, dict):
        return float(lr)
    schedule = keras.saving.deserialize_keras_object(lr)
    # A checkpoint of a scaled run: its schedule is ours, so the user's is inside it.
    return schedule.base if isinstance(schedule, scaling.ScaledSchedule) else schedule


def scale_learning_rate(model: keras.Model, strategy: tf.distribute.Strategy,
                        plan: scaling.LRPlan) -> Callable[[], None]:
    """Scales `model.optimizer`'s learning rate in place for one call; returns what unscales it.

    The optimizer stays the user's object, with its state. A float rate is
    multiplied by `plan.factor` (a warmup then ramps it in the graph, `Steps`)
    and divided by it afterwards, so a change a callback made (ReduceLROnPlateau)
    is kept, unscaled. A schedule is wrapped in a `scaling.ScaledSchedule` for
    the call. A float16 model compiled without loss scaling (a reloaded one,
    say, whose container Keras reloads as float32) gets Keras's dynamic loss scaling (`LossScaleOptimizer`)
    around its optimizer, which float16 gradients need to stay out of the underflow range. A model that is
    float16 itself and has none was compiled with `auto_scale_loss=False`: Keras's compile wraps it otherwise,
    and the user's choice stands.
    """
    optimizer = model.optimizer
    if ("mixed_float16" in layer_policies(model) and model.dtype_policy.name != "mixed_float16"
            and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)):
        with strategy.scope():
            model.optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            model.optimizer.build(model.trainable_variables)
    if not optimizer.built:
        with strategy.scope():
            optimizer.build(model.trainable_variables)
    inner = optimizer.inner_optimizer if isinstance(optimizer, keras.optimizers.LossScaleOptimizer) else optimizer
    if plan.factor == 1.0:
        return lambda: None
    if isinstance(plan.base, keras.optimizers.schedules.LearningRateSchedule):
        schedule = _compat.schedule_of(inner)
        inner.learning_rate = scaling.ScaledSchedule(plan.base, plan.factor, plan.warmup_steps)

        def unscale_schedule():
            inner.learning_rate = schedule

        return unscale_schedule
    variable = inner.learning_rate
    variable.assign(plan.base * plan.factor)

    def unscale():
        variable.assign(variable.numpy() / plan.factor)

    return unscale
