"""The engine for one (model, strategy) pair: model and optimizer in scope, trackers, step functions.

Built on the first fit/evaluate call and cached, so later calls reuse the
traced step functions.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import sys
from typing import Any

import keras
import tensorflow as tf

from trainer import _compat, scaling
from trainer.data import arrays as arrays_lib
from trainer.data import inputs as inputs_lib
from trainer.distribute import strategy as strategy_lib
from trainer.distribute.cluster import is_parameter_server
from trainer.engine.objective import Objective
from trainer.engine.steps import Steps
from trainer.model import models, placement

CACHE_SIZE = 4


@dataclasses.dataclass
class Engine:
    """What one (model, strategy) pair needs to run steps."""

    key: tuple
    strategy: tf.distribute.Strategy
    objective: Objective
    steps: Steps
    # Where evaluation and prediction run: the training strategy, except under
    # parameter-server training, where they run inline on the coordinator.
    eval_strategy: tf.distribute.Strategy
    eval_steps: Steps
    # For the plan: where the XLA setting came from, or why it is off ("" when the Trainer's setting holds).
    jit_note: str = ""
    # Global batch size -> seconds per train step measured by the last fit that sized
    # its calls ("auto"), so the next fit starts at that size (trainer.engine.fusion).
    seconds_per_step: dict[int, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LRSettings:
    """The Trainer's learning-rate options, with the fit's global batch and warmup."""

    rule: str | None
    base_batch_size: int
    batch: scaling.BatchPlan
    warmup_steps: int

    def plan_for(self, optimizer: keras.optimizers.Optimizer) -> scaling.LRPlan:
        rule = scaling.resolve_lr_rule(self.rule, optimizer)
        factor = scaling.lr_factor(rule, self.batch.global_batch_size, self.base_batch_size)
        return scaling.LRPlan(rule, models.base_learning_rate(optimizer), factor, self.warmup_steps)


def jit_for(strategy: tf.distribute.Strategy, setting: bool | str, model: Any = None, data_batch: Any = None,
            compiled_with: bool | str | None = None) -> tuple[bool, str]:
    """XLA or not, and why for the plan: as the settings ask (`asked_jit`), except where the forward pass
    synchronizes the replicas (`synchronizes_in_forward_pass`)."""
    jit, why = asked_jit(strategy, setting, model, compiled_with)
    if jit and synchronizes_in_forward_pass(strategy, model, data_batch):
        return False, ("XLA asked for, but the forward pass all-reduces across the replicas (BatchNormalization's "
                       "global statistics, or the count of masked outputs), which a nested XLA function cannot do")
    return jit, why


def asked_jit(strategy: tf.distribute.Strategy, setting: bool | str, model: Any = None,
              compiled_with: bool | str | None = None) -> tuple[bool, str]:
    """XLA as the settings ask for it, and why, for the plan ("" where the Trainer's setting says it all).

    `Trainer(jit_compile=True or False)` holds. Under "auto", a model's own `compile(jit_compile=True or
    False)` holds; compile's default "auto" (`compiled_with`, noted where the Trainer saw the compile: a
    builder, a `Trainer.distribute()` block) is on for GPUs and TPUs where Keras lets the model have XLA,
    wherever the model was made: Keras turns it off in a strategy's scope, but the trainer's nested XLA
    function runs there as on one device. Unseen, `model.jit_compile` is Keras's resolution, where a False
    is the user's except for a model made in a strategy's scope: there it may be "auto", and stays off.
    """
    if setting != "auto":
        return bool(setting), ""
    compiled = _compat.is_model(model) and getattr(model, "compiled", False)
    explicit = compiled_with if compiled and compiled_with != "auto" else None  # None: "auto", or not seen
    if compiled and model.jit_compile and compiled_with != "auto":
        return True, "XLA from the model's compile(jit_compile=...)"
    if explicit is not None:
        return False, f"off as the model's compile(jit_compile={explicit!r}) left it"
    if not strategy_lib.runs_on_accelerators(strategy):
        return False, ""
    if _compat.is_model(model) and not _compat.supports_jit(model):
        return False, ("off: Keras gives this model no XLA (a layer with supports_jit=False, or op determinism "
                       "enabled)")
    if compiled and compiled_with is None:
        if not _compat.made_in_strategy_scope(model):
            return False, "off as the model's compile(jit_compile=False) asked"
        return False, ("off: the model, made in a strategy's scope, was compiled with jit_compile False, which "
                       "Keras's \"auto\" resolves to there as an explicit False does. For XLA pass "
                       "Trainer(jit_compile=True), or build and compile the model in a function passed as `model`")
    return True, "auto: on for GPUs and TPUs"


def synchronizes_in_forward_pass(strategy: tf.distribute.Strategy, model: Any, data_batch: Any = None) -> bool:
    """Whether the replica's forward pass and loss all-reduce across the replicas: global BatchNormalization
    statistics, or masked outputs, whose unmasked entries are counted over the replicas (`data_batch`, a sample,
    shows whether the outputs carry masks). Then the forward and backward pass cannot be one XLA function
    nested in the replica's step, where MirroredStrategy cannot synchronize ("merge_call called while defining
    a new graph")."""
    if not _compat.is_model(model) or strategy.num_replicas_in_sync == 1:
        return False
    return models.global_batch_norm(model) > 0 or (data_batch is not None and models.outputs_masked(model, data_batch))


def cpu_onednn(strategy: tf.distribute.Strategy) -> bool | None:
    """For the plan: whether oneDNN's CPU kernels run this strategy's replicas.

    None where the plan has nothing to suggest: replicas on GPUs or TPUs;
    parameter-server training (the steps run in other processes); builds
    without oneDNN (TensorFlow's x86-64 Linux and Windows wheels have it); and
    a TF_ENABLE_ONEDNN_OPTS the user set. TensorFlow reads that variable once,
    at start-up; unset, oneDNN is on only on Linux CPUs with AVX512_VNNI,
    AVX512_BF16, AVX_VNNI or AMX.
    """
    if (strategy_lib.runs_on_accelerators(strategy) or is_parameter_server(strategy)
            or "TF_ENABLE_ONEDNN_OPTS" in os.environ
            or sys.platform not in ("linux", "win32") or platform.machine().lower() not in ("x86_64", "amd64")):
        return None
    return _compat.onednn_enabled()


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them in /proc/cpuinfo (empty elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return frozenset(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return frozenset()


# CPU flag -> the bfloat16 unit oneDNN uses, the faster first (CPUs with AMX have AVX512_BF16 too).
BF16_UNITS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX512_BF16"))


def cpu_native_bf16(strategy: tf.distribute.Strategy) -> str | None:
    """For the plan: the bfloat16 units of the CPU that oneDNN runs this strategy's replicas on.

    "AMX" or "AVX512_BF16", or None. With either, `mixed_precision="mixed_bfloat16"`
    trained the example's CNN faster (bench/mixed_precision.py, docs/performance.md);
    elsewhere oneDNN emulates bfloat16, so the plan suggests it only here.
    """
    if (strategy_lib.runs_on_accelerators(strategy) or is_parameter_server(strategy)
            or sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64")
            or not _compat.onednn_enabled()):
        return None
    flags = cpu_flags()
    return next((unit for flag, unit in BF16_UNITS if flag in flags), None)


def prepare(
    model: models.ModelOrBuilder,
    strategy: tf.distribute.Strategy,
    inp: inputs_lib.Input,
    *,
    global_batch_size: int,
    seed: int | None,
    jit_compile: bool | str,
    cache: "list[Engine]",
    in_scope: models.InScope,
    lr: LRSettings | None = None,
    mixed_precision: str | None = None,
    batch_norm: str = "global",
) -> tuple[keras.Model, Engine, scaling.LRPlan | None, placement.Move]:
    """Puts the model (and, when training, its scaled optimizer) in scope; returns it with its engine.

    The model is the user's own object, moved into the scope for the call
    (`placement.Move`): the caller puts it home with `move.back()`.

    Args:
      global_batch_size: the call's global batch: the model is built on the first step's examples.
      lr: the learning-rate settings when training; None for evaluation.
      cache: recent engines (at most `CACHE_SIZE`), reused while model, strategy,
        optimizer, compiled losses and metrics, backing variables and settings match.
      in_scope: the Trainer's record of the backings it made (`models.InScope`).
      mixed_precision: a Keras dtype policy name for a builder's layers, or None.
      batch_norm: "global": BatchNormalization layers normalize with the global batch's statistics when
        several replicas train in sync (`models.synchronize_batch_norm`); "per_replica": with each replica's.
    """
    model = models.from_builder(model, strategy, seed, mixed_precision, in_scope)
    batch = sample_batch(model, inp, global_batch_size, strategy.num_replicas_in_sync)
    models.check_loss(model, keras.utils.unpack_x_y_sample_weight(batch)[0], training=lr is not None)
    move = placement.move_in(model, strategy, in_scope.table(model, strategy), batch, targets=True)
    try:
        # Keras 3.8 and 3.9 mirror metric variables on write: replaced before the key takes their backings
        _compat.metric_variables_on_read(model, strategy)
        lr_plan = None
        if lr is not None and model.optimizer is not None:  # a GAN keeps its optimizers elsewhere
            lr_plan = lr.plan_for(model.optimizer)
            move.undo.append(models.scale_learning_rate(model, strategy, lr_plan))
        if batch_norm == "global" and strategy.num_replicas_in_sync > 1 and not is_parameter_server(strategy):
            move.undo.append(models.synchronize_batch_norm(model))
        jit, note = jit_for(strategy, jit_compile, model, batch, in_scope.jit_asked.get(model))
        warmup = lr_plan.float_warmup() if lr_plan else None
        scaled = (lr_plan.factor, lr_plan.warmup_steps) if lr_plan else None
        objects = (model, strategy, model.optimizer, _compat.compile_loss(model), _compat.compile_metrics(model))
        variables, _ = _compat.model_state(model)
        key = (objects, (jit, note, warmup, scaled, tuple(models.per_replica_batch_norm(model)),
                         tuple(id(_compat.backing(v)) for v in variables)))
        engine = next((e for e in cache if _same(e.key, key)), None)
        if engine is None:
            objective = Objective(model, strategy)
            steps = Steps(strategy, model, objective, jit_compile=jit, warmup=warmup)
            eval_strategy, eval_steps = strategy, steps
            if is_parameter_server(strategy):
                eval_strategy = tf.distribute.get_strategy()  # inline on the coordinator
                eval_steps = Steps(eval_strategy, model, objective, jit_compile=jit)
            engine = Engine(key, strategy, objective, steps, eval_strategy, eval_steps, note)
            cache[:] = [engine] + cache[: CACHE_SIZE - 1]  # bounded: engines hold their models
    except BaseException:
        move.back()
        raise
    return model, engine, lr_plan, move


def sample_batch(model: keras.Model, inp: inputs_lib.Input, global_batch_size: int, num_replicas: int) -> Any:
    """The examples to build `model` on: as many as the first replica computes on in the first step, the shape
    its step is traced with (a batch of another size can fail where the user's does not: targets that
    broadcast against the outputs at one row, keras-team/keras#20712; and Keras's warnings about the inputs,
    which name their shapes, would show twice); as many as the model's fixed batch size, if it has one
    (`checks` checked the batches against it)."""
    first = global_batch_size if inp.num_examples is None else min(global_batch_size, inp.num_examples)
    _, rows = arrays_lib.computed_rows(max(1, first), range(1), num_replicas)
    return inp.sample(models.fixed_batch_size(model) or rows)


def _same(a: tuple, b: tuple) -> bool:
    # Objects by identity (ids can be reused once an object is freed), settings by value. The backings'
    # ids are settings: the engine's traced steps hold those variables, so their ids are not reused.
    return all(x is y for x, y in zip(a[0], b[0])) and a[1] == b[1]
