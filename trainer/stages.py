"""The stages of a fit (`Runs.fit`), in the order it runs them, and the ones `evaluate` and `predict` share.

Each is a function of the call's arguments, the Trainer's settings and what the stages before it decided; every
check runs before anything changes (the process, the model, a file):

1. `checked_fit_call`: the callbacks and fit's own arguments -> `calls.FitCall`.
2. `fit_data`: the data, checked where its form is known (`data/boundary.py`) -> the inputs.
3. `check_model`: compiled, and a dtype policy the Trainer can keep.
4. `Batching.schedule`: the global batch, the epoch's steps, warmup and learning-rate settings -> `calls.Schedule`.
5. `checks.check_fit`: the data against the model's inputs.
6. `Runs._model_in_scope`: the model in the strategy's scope, with its steps (`engine.py`) -> `calls.Scoped`.
7. `fit_plan`, then `announce`: the plan, printed once by the chief.
8. `Runs._run_epochs`: the epochs with callbacks -> the history.

`evaluate` and `predict` share `Runs._one_pass` (-> `calls.OnePass`) and `Runs._model_in_scope`.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import keras
import tensorflow as tf

from trainer import _compat, calls, checks, options, scaling
from trainer.data import class_weights
from trainer.data import boundary
from trainer.data import inputs as inputs_lib
from trainer.data import readers as readers_lib
from trainer.data.array_input import ArrayInput
from trainer.data.dataset_inputs import BatchedInput, DatasetInput
from trainer.data.pipeline_inputs import FileShardsInput
from trainer.distribute import strategy as strategy_lib
from trainer.distribute.cluster import cluster_source, is_parameter_server, restarted, strategy_cluster_info
from trainer.engine import callback_hooks
from trainer.engine import engine as engine_lib
from trainer.engine.fusion import StepFusion
from trainer.engine.plan import Plan, batch_norm_note, optimizer_note, strategy_label
from trainer.model import models
from trainer.model.own_steps import ModelSteps
from trainer.user_line import user_stacklevel


def checked_fit_call(callbacks, strategy: tf.distribute.Strategy, *, batch_size, validation_split,
                     validation_freq, validation_batch_size, validation_steps, class_weight, epochs, initial_epoch,
                     steps_per_epoch, shuffle: bool, verbose) -> calls.FitCall:
    """fit's arguments other than the data and the model, checked; the launcher's backup joins the callbacks."""
    callbacks = checks.check_callbacks(callbacks)
    # Under parameter servers only the coordinator runs callbacks.
    checks.check_callbacks_on_workers(callbacks, 1 if is_parameter_server(strategy) else
                                      strategy_cluster_info(strategy).num_workers)
    callbacks = _launcher_backup(callbacks)
    options.check_fit_args(batch_size=batch_size, validation_split=validation_split,
                           validation_freq=validation_freq, validation_batch_size=validation_batch_size)
    validation_steps = options.steps_arg("validation_steps", validation_steps, fix="Pass a positive number of "
                                         "steps, or None to validate on all of validation_data.")
    class_weights.check_class_weight(class_weight)
    epochs, steps_per_epoch = options.loop_args(epochs=epochs, initial_epoch=initial_epoch,
                                                steps_per_epoch=steps_per_epoch)
    epochs, steps_per_epoch = capped(epochs, steps_per_epoch)
    validation_steps = capped(None, validation_steps)[1]
    return calls.FitCall(callbacks, epochs, initial_epoch, steps_per_epoch, shuffle, verbosity(verbose),
                   validation_steps, validation_freq, validation_batch_size or batch_size)


def capped(epochs: int | None, steps: int | None) -> tuple[int | None, int | None]:
    """Epochs and steps within Keras's debugging caps (`keras.config.set_max_epochs`, `set_max_steps_per_epoch`),
    with Keras's warnings, as every fit, evaluate and predict of Keras's applies them."""
    max_epochs, max_steps = _compat.debug_limits()
    if max_epochs and epochs is not None and max_epochs < epochs:
        warnings.warn("Limiting epochs to %d" % max_epochs, stacklevel=user_stacklevel())
        epochs = max_epochs
    if max_steps and (not steps or max_steps < steps):
        warnings.warn("Limiting steps_per_epoch to %d" % max_steps, stacklevel=user_stacklevel())
        steps = max_steps
    return epochs, steps


def fit_data(call: calls.FitCall, x, y, sample_weight, strategy: tf.distribute.Strategy, *, class_weight,
             validation_split, validation_data, seed: int | None) -> tuple[inputs_lib.Input, inputs_lib.Input | None]:
    """(training input, validation input or None), each checked where its form is known."""
    readers = workers(strategy)
    train, val = boundary.fit_inputs(x, y, sample_weight, arg=data_arg(y, sample_weight),
                                     class_weight=class_weight, shuffle=call.shuffle,
                                     validation_split=validation_split, validation_data=validation_data,
                                     steps_per_epoch=call.steps_per_epoch, **readers,
                                     is_chief=strategy_cluster_info(strategy).is_chief)
    if val is not None and call.validation_freq == 0:
        raise ValueError("`validation_freq` must be a positive number of epochs (or a list of epochs) when fit "
                         "validates: model.fit divides the epoch by it. Received: validation_freq=0. Pass e.g. "
                         "validation_freq=1.")
    num_workers = readers["num_workers"]
    if seed is None and call.shuffle and num_workers > 1 and isinstance(train, ArrayInput):
        raise ValueError(
            f"The {num_workers} workers must shuffle the arrays alike, and with seed=None each drew its own "
            "seed. Received: Trainer(seed=None) with shuffle=True on several workers. Pass Trainer(seed=0) "
            "(any integer, the same on every worker), or shuffle=False."
        )
    return train, val


def by_file_shards(train: inputs_lib.Input, strategy: tf.distribute.Strategy, schedule: calls.Schedule, *, shards: int,
                   steps_per_epoch: int | None) -> inputs_lib.Input:
    """`Trainer(data_sharding="files")`: a tf.data.Dataset that leaves its shard policy to tf.distribute, read by
    `shards` file shards (`pipeline_inputs.FileShardsInput`); other inputs as they are. Refuses, before anything runs,
    what can't be read so: no `steps_per_epoch`, a batch or replica count that doesn't divide, no files."""
    if not isinstance(train, (DatasetInput, BatchedInput)) or getattr(train, "adapter", None):
        return train
    if train.dataset.options().experimental_distribute.auto_shard_policy != tf.data.experimental.AutoShardPolicy.AUTO:
        return train  # the user's own policy, as tf.distribute applies it
    batch, replicas = schedule.batch.global_batch_size, schedule.batch.num_replicas
    fix = "Or pass Trainer(data_sharding='exact'): every worker reads all, and the numbers are model.fit's."
    if is_parameter_server(strategy):
        raise ValueError("`data_sharding='files'` is for the synchronous strategies: under parameter-server training "
                         "each worker reads a shard of its own already. Received: data_sharding='files' with "
                         f"{strategy_label(strategy)}. Pass data_sharding='exact'.")
    if steps_per_epoch is None:
        raise ValueError("`steps_per_epoch` must be given with Trainer(data_sharding='files'): each file shard is read "
                         "on and on, so an epoch is a number of steps. Received: steps_per_epoch=None. Pass "
                         f"steps_per_epoch=..., e.g. the examples in all files // {batch}. {fix}")
    if batch % shards or shards % replicas:
        raise ValueError(
            f"`file_shards` must divide the global batch and be divisible by the replicas, so that every step takes "
            f"the same examples from each shard on every layout. Received: file_shards={shards} with a global batch "
            f"of {batch} on {replicas} replica(s). Pass a file_shards that does, e.g. {replicas} or "
            f"{math.gcd(batch, replicas * shards)}, and a batch that is a multiple of it. {fix}")
    candidate = FileShardsInput(train, shards, batch)
    try:  # the last shard has files only if all have; its first example costs a read buffer of one file
        next(iter(_compat.file_shard(candidate.examples(), shards, shards - 1)))
    except (tf.errors.OpError, StopIteration) as err:
        detail = "it is empty" if isinstance(err, StopIteration) else str(err).splitlines()[0]
        raise ValueError(
            f"`data_sharding='files'` reads a dataset by its files, and its file shard {shards - 1} of {shards} "
            f"can't be read: {detail}. Received: a {train.form} with file_shards={shards}. Build the dataset from "
            f"at least {shards} files (TFRecordDataset, TextLineDataset, list_files without shuffle), or lower "
            f"file_shards. {fix}") from None
    return candidate


def check_model(model: models.ModelOrBuilder, mixed_precision: str | None, *, compiled: bool = True) -> None:
    """A model (not a builder, which is checked once built) that is compiled, if `compiled`, and whose dtype
    policy agrees with the Trainer's `mixed_precision`; first, versions and hooks that keep the trainer's promise
    (`_compat.check_platform`)."""
    _compat.check_platform()
    if compiled and _compat.is_model(model):
        models.check_compiled(model)
    models.check_precision(model, mixed_precision)


def fusion(setting: int | str, engine: engine_lib.Engine, batch: scaling.BatchPlan, steps_per_epoch: int | None,
           callbacks: list) -> tuple[StepFusion, str]:
    """Steps per call for this fit, and which setting chose them.

    "auto" takes `model.compile(steps_per_execution=N)` when N > 1, else sizes
    calls from the engine's last measured step time.
    """
    source = ""
    keras_steps = callback_hooks.keras_steps_per_call(engine.steps.model)
    if setting == "auto" and keras_steps > 1:
        setting, source = keras_steps, f"steps_per_execution={keras_steps} from the model's compile()"
    chosen = StepFusion.for_fit(
        setting, steps_per_epoch=steps_per_epoch,
        batch_hooks=setting == "auto" and any(callback_hooks.has_batch_hooks(c) for c in callbacks),
        num_workers=strategy_cluster_info(engine.strategy).num_workers,
        seconds_per_step=engine.seconds_per_step.get(batch.global_batch_size))
    return chosen, source


def fit_plan(strategy: tf.distribute.Strategy, inp: inputs_lib.Input, schedule: calls.Schedule,
             lr_plan: scaling.LRPlan | None, steps: StepFusion, model: keras.Model, *, jit: bool, jit_note: str = "",
             sources: tuple[str, ...] = (), process: str = "", moved: str = "", resumes: bool = False,
             unguarded: tuple[str, ...] = (), draws: dict | None = None) -> Plan:
    """What fit decided, as data (`Plan`); `sources` say where settings came from when not the Trainer;
    `draws`: the random draws the model's steps made per replica when they ran before (`Steps.named_draws`)."""
    draws = draws or {}
    batch = schedule.batch
    num_workers = strategy_cluster_info(strategy).num_workers
    parameter_server = is_parameter_server(strategy)
    policy, why = inp.sharding(num_workers, parameter_server=parameter_server)
    if lr_plan is None:  # no model.optimizer: a model whose train_step uses optimizers of its own
        lr_plan = scaling.LRPlan(None, 0.0, 1.0, 0)
        base_lr, scaled_lr = "the model's own optimizers", "unchanged"
    else:
        base_lr, scaled_lr = lr_plan.describe()
    return Plan(
        strategy=strategy_label(strategy),
        num_replicas=batch.num_replicas,
        num_workers=num_workers,
        global_batch_size=batch.global_batch_size,
        per_replica_batch_size=batch.per_replica_batch_size,
        num_examples=inp.num_examples,
        repeated_data=parameter_server,
        repeated_shards=isinstance(inp, FileShardsInput),
        steps_per_epoch=schedule.steps_per_epoch,
        shard_policy=policy,
        shard_reason=why,
        lr_rule=lr_plan.rule,
        base_lr=base_lr,
        scaled_lr=scaled_lr,
        base_batch_size=schedule.lr.base_batch_size,
        warmup_steps=lr_plan.warmup_steps if lr_plan.factor != 1.0 else 0,  # nothing to ramp otherwise
        steps_per_execution=steps.steps,
        auto_fusion=steps.auto,
        jit_compile=jit,
        onednn=engine_lib.cpu_onednn(strategy),
        precision=models.precision(model),
        native_bf16=engine_lib.cpu_native_bf16(strategy),
        step=ModelSteps.of(model).describe(),
        batch_norm=tuple(models.per_replica_batch_norm(model)),
        global_batch_norm=models.global_batch_norm(model),
        optimizer=optimizer_note(model.optimizer, strategy.num_replicas_in_sync),
        batch_source=schedule.source,
        execution_source="; ".join(filter(None, [*sources, jit_note])),
        process=process,
        platform=_compat.check_platform(),
        placement=moved,
        cluster=cluster_source() if num_workers > 1 or parameter_server or restarted() else "",
        unguarded=unguarded,
        resume=inp.resume(schedule.user_steps, num_workers, readers_lib.reads_in_step(strategy)) if resumes else None,
        draws=tuple(draws.values()),
        gradient_values=sum(v.shape.num_elements() or 0 for v in model.trainable_variables),
        gradient_bytes=sum((v.shape.num_elements() or 0) * tf.as_dtype(v.dtype).size
                           for v in model.trainable_variables),
        devices=strategy_lib.gpus_text(strategy),
    )


def announce(plan: Plan, *, verbose: int, is_chief: bool) -> None:
    """The plan, printed once by the chief; and a warning when BatchNormalization keeps per-replica statistics."""
    if verbose and is_chief:
        print(plan.describe(), flush=True)
    if plan.batch_norm and plan.num_replicas > 1:
        warnings.warn(f"Per-replica BatchNormalization: {batch_norm_note(plan.batch_norm, plan.num_replicas)}.",
                      stacklevel=user_stacklevel())


def verbosity(verbose) -> int | None:
    """Keras's "auto" is 1; None leaves the Trainer's."""
    return 1 if verbose == "auto" else verbose


def data_arg(y: Any, sample_weight: Any) -> str:
    """How errors name the data: `data` when given as one object, `x` when given Keras's way with y."""
    return "data" if y is None and sample_weight is None else "x"


def workers(strategy: tf.distribute.Strategy, *, training: bool = True) -> dict[str, Any]:
    """The workers that will read an input: under parameter-server training, evaluation and prediction run on
    the coordinator, one process."""
    parameter_server = is_parameter_server(strategy)
    num_workers = 1 if parameter_server and not training else strategy_cluster_info(strategy).num_workers
    return {"num_workers": num_workers, "parameter_server": parameter_server and training}


def _launcher_backup(callbacks: list) -> list:
    from trainer.callbacks.backup import launcher_backup  # callbacks/ builds on trainer/

    return launcher_backup(callbacks)
