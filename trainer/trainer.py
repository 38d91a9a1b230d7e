"""`Trainer`: fit, evaluate and predict a Keras model under any tf.distribute strategy.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import warnings
from typing import Any, Callable, Iterator, Sequence

import keras
import numpy as np
import tensorflow as tf

from trainer import _compat, calls, checks, options, scaling, stages
from trainer.data import boundary
from trainer.data import inputs as inputs_lib
from trainer.data.passes import Passes
from trainer.distribute import collectives
from trainer.distribute.ambient import ambient_strategy, data_strategy, model_home, same_layout, takes
from trainer.distribute import strategy as strategy_lib
from trainer.distribute.cluster import cluster_info, is_parameter_server, strategy_cluster_info
from trainer.engine import callback_hooks, eval_loop, loop, malloc, ps
from trainer.engine import engine as engine_lib
from trainer.engine.plan import strategy_label
from trainer.engine.steps import Steps
from trainer.history import History
from trainer.model import models, placement
from trainer.model import route as route_lib
from trainer.model.own_steps import logs_in_order


def _quiet_tf_info(method):
    """Hides TensorFlow's INFO chatter (a line per cross-device reduce) while `method` runs, and on a task other
    than the chief Keras's warnings: they are about the model and the data, the same on every task, and the
    chief shows them once, as model.fit would."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        logger = tf.get_logger()
        level = logger.level
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
        try:
            if cluster_info().is_chief:
                return method(*args, **kwargs)  # the user's filters as they are (a change would reset their "once")
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", module=r"keras(\.|$)")
                return method(*args, **kwargs)
        finally:
            logger.setLevel(level)

    return wrapper


def _passed(method: Callable, values: dict[str, Any]) -> dict[str, Any]:
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


def _one_pass_callbacks(callbacks: list, model: keras.Model, verbose: Any, steps: int | None,
                        known_steps: int | None, *, progress: bool) -> keras.callbacks.CallbackList:
    """`evaluate`'s or `predict`'s callbacks, with the params Keras's give them (one epoch of its steps), and
    Keras's own progress bar where `progress`, as `model.evaluate` and `model.predict` show it."""
    if progress:
        bar = keras.callbacks.ProgbarLogger()
        bar.handles_fused_steps = True  # it draws from the step index it is given, so calls may fuse steps
        bar.reads_batch_logs = False  # the chief's alone: the metrics are read for it at the pass's end only
        callbacks = callbacks + [bar]
    return keras.callbacks.CallbackList(callbacks, model=model, verbose="auto" if verbose is None else verbose,
                                        epochs=1, steps=known_steps if steps is None else steps)


def _shows_progress(verbose: Any, trainer_verbose: int) -> bool:
    """Whether evaluate or predict draws a progress bar: at Keras's "auto" (1) and 1 or 2, on the chief only;
    unset, the Trainer's verbosity decides."""
    resolved = trainer_verbose if verbose is None else verbose
    return resolved not in (0, False) and cluster_info().is_chief


# `model.fit`'s global batch for arrays when none is given (keras/src/trainers/trainer.py, 3.8-3.15).
KERAS_BATCH_SIZE = 32


class _Default(str):
    """A default that reads as its value, so that the Trainer can tell it from the same value given."""


def _no_unknown(method: str, unknown: dict[str, Any]) -> None:
    if unknown:
        raise TypeError(f"`{method}` got arguments Keras's {method} does not take. Received: {sorted(unknown)}. "
                        f"Pass only what model.{method} takes.")


class Trainer:
    """Trains a compiled Keras model under a tf.distribute strategy, with exact results.

    Losses and metrics are aggregated across replicas and workers so that the
    numbers do not depend on how many devices ran the job.

    Example:

    ```python
    import keras, numpy as np
    from trainer import Trainer

    x, y = np.random.rand(1000, 8), np.random.randint(0, 2, 1000)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = Trainer(strategy="mirrored", per_replica_batch_size=64).fit(model, (x, y), epochs=2)
    ```

    Args:
      strategy: a `tf.distribute.Strategy` or a name from `STRATEGY_NAMES`.
      per_replica_batch_size: examples per replica per step; the global batch is
        this times the replicas in sync. Default 32 when `batch_size` is unset.
      batch_size: a fixed global batch instead. Not both.
      lr_scaling: "auto" (linear for SGD, sqrt for adaptive optimizers),
        "linear", "sqrt" or None.
      base_batch_size: the batch the model's learning rate was tuned for.
        Defaults to `per_replica_batch_size`, or `batch_size` when that is set
        (a fixed global batch then keeps its learning rate).
      warmup_epochs: epochs of linear warmup from the base to the scaled LR.
      warmup_steps: the same in optimizer steps. Not both.
      seed: seeds the per-epoch shuffle of array inputs and a builder's initial
        weights, from generators of the trainer's own: the global ones (`random`,
        `np.random`, Keras's) are left as they were. None: a builder draws from
        the global generators as Keras does, and the shuffle from a seed drawn
        once per Trainer (one worker only: several must agree on an order).
      shuffle: shuffle array inputs each epoch.
      steps_per_execution: steps fused into one `tf.function` call, or "auto":
        sized from the measured step time to ~1 s per call (see `trainer.engine.fusion`);
        1 when a callback has batch-level hooks, 32 across several workers.
      jit_compile: XLA for the forward and backward pass; "auto" turns it on for
        GPUs and TPUs only (it slows CNNs down on CPU).
      mixed_precision: None (float32), "mixed_float16" (GPUs; adds Keras's
        dynamic loss scaling) or "mixed_bfloat16" (TPUs, recent GPUs, CPUs with
        AMX or AVX512_BF16): layers compute in 16 bits, variables and losses
        stay float32. Opt-in; the plan suggests it on such CPUs.
      batch_norm: "global": on several replicas in sync, BatchNormalization
        layers normalize with the global batch's mean and variance, as on one
        device (Keras's `synchronized=True`, set for the call: one small
        round between the replicas per layer each way, forward and backward;
        between workers each round is a collective over the network, docs/performance.md).
        "per_replica": each replica's own share's, as Keras's fit does, for
        speed; the numbers then depend on the replica count.
      verbose: 0 silent, 1 plan and progress bar, 2 plan and one line per epoch
        (chief only).
      nan_guard: stop training at the first non-finite loss (see `trainer.callbacks.NanGuard`).
      data_sharding: how several workers split a tf.data.Dataset. "exact": every
        worker reads every batch and keeps its replicas' share, as the DATA
        policy does: `model.fit`'s numbers, for W times the reading. "files":
        each worker reads only its file shards (`file_shards` canonical shards
        of the dataset's files, each repeated; fit then needs `steps_per_epoch`):
        the same numbers on any number of replicas or workers that divides
        `file_shards`, but not `model.fit`'s batches. A dataset's own
        `auto_shard_policy` wins over both; other inputs are read as before.
      file_shards: the canonical shards of data_sharding="files"; it must divide
        the global batch, and the replica count must divide it.
      tune_malloc: the trainer's one process-wide patch (`trainer.engine.malloc`): raise
        glibc's mmap threshold over the 128 KiB that tf.data pins for the whole
        process, which makes every large allocation fault its pages in again.
        Applied once per process, at the first fit/evaluate/predict; the plan
        says so. False leaves the process as TensorFlow set it.
    """

    def __init__(
        self,
        *,
        strategy: str | tf.distribute.Strategy = "auto",
        per_replica_batch_size: int | None = None,
        batch_size: int | None = None,
        lr_scaling: str | None = _Default("auto"),
        base_batch_size: int | None = None,
        warmup_epochs: float = 0,
        warmup_steps: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        steps_per_execution: int | str = "auto",
        jit_compile: bool | str = "auto",
        mixed_precision: str | None = None,
        batch_norm: str = "global",
        verbose: int = 1,
        nan_guard: bool = True,
        tune_malloc: bool = True,
        data_sharding: str = "exact",
        file_shards: int = 8,
    ):
        strategy_lib.check_strategy_name(strategy)
        options.check_trainer_options(
            per_replica_batch_size=per_replica_batch_size, batch_size=batch_size, base_batch_size=base_batch_size,
            lr_scaling=lr_scaling, warmup_epochs=warmup_epochs, warmup_steps=warmup_steps,
            steps_per_execution=steps_per_execution, jit_compile=jit_compile, mixed_precision=mixed_precision,
            seed=seed, nan_guard=nan_guard, tune_malloc=tune_malloc, batch_norm=batch_norm,
            data_sharding=data_sharding, file_shards=file_shards,
        )
        self._batch_given = batch_size is not None or per_replica_batch_size is not None
        self._lr_scaling_given = not isinstance(lr_scaling, _Default)  # distribute() scales only when asked
        if batch_size is None and per_replica_batch_size is None:
            per_replica_batch_size = 32
        self.strategy = strategy
        self.per_replica_batch_size = per_replica_batch_size
        self.batch_size = batch_size
        self.lr_scaling = lr_scaling if lr_scaling is None else str(lr_scaling)
        self._base_given = base_batch_size
        self.base_batch_size = base_batch_size or per_replica_batch_size or batch_size
        self.warmup_epochs = warmup_epochs
        self.warmup_steps = warmup_steps
        self.seed = seed
        # The shuffle's seed: the user's, else drawn once from the OS (not from the global generators).
        self._shuffle_seed = seed if seed is not None else int(np.random.SeedSequence().entropy % 2**32)
        self.shuffle = shuffle
        self.steps_per_execution = steps_per_execution
        self.jit_compile = jit_compile
        self.mixed_precision = mixed_precision
        self.batch_norm = batch_norm
        self.verbose = verbose
        self.nan_guard = nan_guard
        self.tune_malloc = tune_malloc
        self.data_sharding = data_sharding
        self.file_shards = file_shards
        self._strategies: dict[Any, tf.distribute.Strategy] = {}
        self._coordinators: list[tuple[tf.distribute.Strategy, Any]] = []
        # Resolve now: multi-worker strategies must be created before TensorFlow runs any op. Where the process
        # runs one made elsewhere, a model built in its scope trains on it (`_call_strategy`); other calls refuse.
        try:
            _quiet_tf_info(self._resolve_strategy)(None)  # TensorFlow's "Using MirroredStrategy with devices" line
        except strategy_lib.AnotherMultiWorker:
            pass
        self._engines: list[engine_lib.Engine] = []
        self._in_scope = models.InScope()  # the in-scope backings this Trainer made for the user's models
        self._nan_guard = None  # the default NanGuard, made at the first fit

    # Public API ----------------------------------------------------------------

    @_quiet_tf_info
    def fit(
        self,
        model: models.ModelOrBuilder,
        x: Any = None,
        y: Any = None,
        *,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: int | str | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool | None = None,
        class_weight: dict[int, float] | None = None,
        sample_weight: Any = None,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int | Sequence[int] = 1,
        strategy: str | tf.distribute.Strategy | None = None,
    ) -> History:
        """Trains `model` on the data; returns a `History` whose `.model` is the trained model.

        Takes what `model.fit` takes, with the model first: `trainer.fit(model, x, y, batch_size=64,
        epochs=3, validation_split=0.1, class_weight=..., callbacks=[...])` gives `model.fit`'s numbers on
        any strategy.

        Args:
          model: a compiled `keras.Model`, or a zero-argument function that builds
            and compiles one (called inside the strategy's scope).
          x: features with `y` given; or alone, `(x, y[, sample_weight])` arrays, a
            `tf.data.Dataset` (batched: its batches are the global batches; unbatched:
            the trainer batches it), a generator of batches, a `keras.utils.PyDataset`,
            or a function `input_context -> Dataset`.
          y, sample_weight: targets and weights, for arrays.
          batch_size: the global batch for arrays and unbatched datasets in this
            call; it wins over the Trainer's batch settings (the plan says so), and
            the learning rate is then left as compiled.
          epochs: the epoch to stop after (as in Keras, counted from 0).
          verbose: overrides the trainer's verbosity for this call (Keras's "auto" is 1).
          callbacks: `keras.callbacks.Callback` instances.
          validation_split: the last fraction of the arrays' rows, taken before
            shuffling, to validate on.
          validation_data: validated at the end of every `validation_freq`-th epoch;
            any form `x` takes, or `(x, y[, sample_weight])`.
          shuffle: shuffle arrays each epoch (a PyDataset's batch order); default: the Trainer's.
          class_weight: {class index: weight}; classes left out weigh 1.0.
          initial_epoch: the epoch to start from.
          steps_per_epoch: cap on steps per epoch; needed for infinite data.
          validation_steps: cap on validation steps.
          validation_batch_size: the global batch for validation arrays (default: training's).
          validation_freq: validate after every this many epochs, or after the epochs listed (from 1).
          strategy: overrides the trainer's strategy for this call.
        """
        return self._through_model("fit", model, strategy, _passed(Trainer.fit, locals()))

    def _fit(self, model, x=None, y=None, *, batch_size=None, epochs=1, verbose=None, callbacks=None,
             validation_split=0.0, validation_data=None, shuffle=None, class_weight=None, sample_weight=None,
             initial_epoch=0, steps_per_epoch=None, validation_steps=None, validation_batch_size=None,
             validation_freq=1, strategy: tf.distribute.Strategy, planned_batch: int | None = None,
             guard: bool = True, scale_lr: bool = True) -> History:
        """fit's engine, with the arguments Keras's own fit received (`fit` documents them); its stages in
        order (trainer/stages.py), every check before anything changes. `guard`: the Trainer's NaN guard may
        join the callbacks; `scale_lr`: its learning-rate rule may apply (neither under `distribute()`, where
        `model.fit`'s contract holds, unless the Trainer was given `lr_scaling`)."""
        call = stages.checked_fit_call(
            callbacks, strategy, batch_size=batch_size, validation_split=validation_split,
            validation_freq=validation_freq, validation_batch_size=validation_batch_size,
            validation_steps=validation_steps, class_weight=class_weight, epochs=epochs, initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch, shuffle=self.shuffle if shuffle is None else shuffle,
            verbose=self.verbose if verbose is None else verbose)
        train, val = stages.fit_data(call, x, y, sample_weight, strategy, class_weight=class_weight,
                                     validation_split=validation_split, validation_data=validation_data,
                                     seed=self.seed)
        stages.check_model(model, self.mixed_precision)
        schedule = self._schedule(strategy, train, batch_size, planned_batch, call.steps_per_epoch, scale_lr)
        if self.data_sharding == "files":
            train = stages.by_file_shards(train, strategy, schedule, shards=self.file_shards,
                                          steps_per_epoch=call.steps_per_epoch)
        model = checks.check_fit(model, train, val, batch=schedule.batch, epoch_steps=schedule.steps_per_epoch,
                                 epochs=call.epochs, initial_epoch=call.initial_epoch,
                                 warmup=(self.warmup_epochs, schedule.lr.warmup_steps))
        scoped = self._model_in_scope(model, strategy, train, schedule.batch, lr=schedule.lr)
        engine = scoped.engine
        with scoped.move:  # on the way out the user's model goes home with its trained state, as after model.fit
            steps, steps_source = stages.fusion(self.steps_per_execution, engine, schedule.batch,
                                                schedule.steps_per_epoch, call.callbacks)
            plan = stages.fit_plan(strategy, train, schedule, scoped.lr_plan, steps, scoped.model,
                                   jit=engine.steps.xla, jit_note=engine.jit_note, sources=(steps_source,),
                                   process=scoped.process, moved=scoped.move.describe(),
                                   unguarded=callback_hooks.unguarded(call.callbacks),
                                   resumes=any(getattr(c, "resumes", False) for c in call.callbacks),
                                   draws={**engine.eval_steps.named_draws, **engine.steps.named_draws})
            context = loop.TrainContext(strategy, strategy_cluster_info(strategy), plan, epochs=call.epochs,
                                        initial_epoch=call.initial_epoch, fusion=steps, lr_plan=scoped.lr_plan)
            stages.announce(plan, verbose=call.verbose, is_chief=context.is_chief)
            return self._run_epochs(engine, context, call, scoped.model, train, val, schedule, guard)

    @_quiet_tf_info
    def evaluate(
        self,
        model: models.ModelOrBuilder,
        x: Any = None,
        y: Any = None,
        *,
        batch_size: int | None = None,
        verbose: int | None = None,
        sample_weight: Any = None,
        steps: int | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        return_dict: bool = False,
        strategy: str | tf.distribute.Strategy | None = None,
    ) -> float | list[float] | dict[str, float]:
        """Returns the loss and metrics, exact over every example of the data, as `model.evaluate` does.

        Takes what `model.evaluate` takes, with the model first, and returns what it returns: a float
        when there is one value, else a list in Keras's order (`model.metrics_names`); with
        `return_dict=True`, {metric name: value}. `verbose` as Keras's ("auto" or 1: a progress bar; 0:
        silent); unset, the Trainer's.
        """
        return self._through_model("evaluate", model, strategy, _passed(Trainer.evaluate, locals()))

    def _evaluate(self, model, x=None, y=None, *, batch_size=None, verbose=None, sample_weight=None, steps=None,
                  callbacks=None, return_dict=False, strategy: tf.distribute.Strategy,
                  planned_batch: int | None = None, **unknown) -> float | list[float] | dict[str, float]:
        """evaluate's engine, with the arguments Keras's own evaluate received."""
        _no_unknown("evaluate", unknown)
        call = self._one_pass("evaluate", model, x, y, sample_weight, batch_size=batch_size, steps=steps,
                              callbacks=callbacks, strategy=strategy, planned_batch=planned_batch)
        scoped = self._model_in_scope(call.model, strategy, call.inp, call.batch)
        with scoped.move:
            known = call.inp.num_steps(call.batch.global_batch_size)
            callback_list = _one_pass_callbacks(call.callbacks, scoped.model, verbose, call.steps, known,
                                                progress=_shows_progress(verbose, self.verbose))
            readers = self._readers(scoped.engine.eval_strategy, call.batch)
            logs = eval_loop.run_eval(scoped.engine.eval_steps, readers, call.inp, callback_list, num_steps=call.steps,
                                      known_steps=known)
        return dict(sorted(logs.items())) if return_dict else logs_in_order(scoped.model, logs)  # sorted, as Keras's

    @_quiet_tf_info
    def predict(
        self,
        model: models.ModelOrBuilder,
        x: Any,
        *,
        batch_size: int | None = None,
        verbose: int | None = None,
        steps: int | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        strategy: str | tf.distribute.Strategy | None = None,
    ) -> Any:
        """Returns the model's outputs as NumPy, one row per input row, in input order (as `model.predict`).

        `x` is arrays, a dataset, a generator or a PyDataset of features (the
        features of `(x, y)` elements are used). `callbacks` get the predict hooks as under
        `model.predict`, each batch's outputs in `on_predict_batch_end`'s logs. `verbose` as Keras's
        ("auto" or 1: a progress bar; 0: silent); unset, the Trainer's.
        """
        return self._through_model("predict", model, strategy, _passed(Trainer.predict, locals()))

    def _predict(self, model, x, *, batch_size=None, verbose=None, steps=None, callbacks=None,
                 strategy: tf.distribute.Strategy, planned_batch: int | None = None) -> Any:
        """predict's engine, with the arguments Keras's own predict received."""
        call = self._one_pass("predict", model, x, None, None, batch_size=batch_size, steps=steps,
                              callbacks=callbacks, strategy=strategy, planned_batch=planned_batch)
        malloc.tune_process(self.tune_malloc)
        model = models.from_builder(call.model, strategy, self.seed, self.mixed_precision)
        sample_x = engine_lib.sample_batch(model, call.inp, call.batch.global_batch_size,
                                           strategy.num_replicas_in_sync)
        with placement.move_in(model, strategy, self._in_scope.table(model, strategy), sample_x, targets=False):
            if is_parameter_server(strategy):
                strategy = tf.distribute.get_strategy()  # inline on the coordinator
            known = call.inp.num_steps(call.batch.global_batch_size)
            callback_list = _one_pass_callbacks(call.callbacks, model, verbose, call.steps, known,
                                                progress=_shows_progress(verbose, self.verbose))
            with eval_loop.one_pass(self._readers(strategy, call.batch), call.inp,
                                    read_all=call.steps is None) as reader:
                outputs = eval_loop.run_predict(self._predict_steps(model, strategy).predictions(reader),
                                                callback_list, num_steps=call.steps, known_steps=known)
        return eval_loop.joined(outputs)

    def _one_pass(self, method: str, model, x, y, sample_weight, *, batch_size, steps, callbacks,
                  strategy: tf.distribute.Strategy, planned_batch: int | None) -> calls.OnePass:
        """`evaluate`'s or `predict`'s (`method`) arguments, checked before anything changes."""
        callbacks = checks.check_callbacks(callbacks)
        options.check_fit_args(batch_size=batch_size)
        steps = options.steps_arg("steps", steps, fix="Pass a positive number of steps, or None for all.")
        steps = stages.capped(None, steps)[1]
        workers = stages.workers(strategy, training=False)
        if method == "evaluate":
            inp = boundary.evaluate_input(x, y, sample_weight, arg=stages.data_arg(y, sample_weight), steps=steps,
                                          **workers)
        else:
            inp = boundary.predict_input(x, model, **workers)
        stages.check_model(model, self.mixed_precision, compiled=method == "evaluate")
        batch, _ = self._batch_plan(strategy, inp, batch_size, planned_batch)
        check = checks.check_evaluate if method == "evaluate" else checks.check_predict
        return calls.OnePass(check(model, inp, batch=batch), inp, batch, steps, callbacks)

    # Keras's per-batch methods, reached beneath a model's own code (`distribute()`, a routed call) ----------

    def _train_on_batch(self, model, x, y=None, sample_weight=None, class_weight=None, return_dict=False, *,
                        strategy: tf.distribute.Strategy, planned_batch: int | None = None) -> Any:
        """`model.train_on_batch`: one optimizer step on the global batch, split over the replicas with each
        weighed by its share (exact); the metrics over this batch alone, or accumulated since the last reset
        where the installed Keras's do (`_compat.on_batch_resets_metrics`)."""
        inp, batch = self._one_batch(strategy, x, y, sample_weight, class_weight=class_weight, training=True)
        stages.check_model(model, self.mixed_precision)
        scoped = self._model_in_scope(
            model, strategy, inp, batch, lr=engine_lib.LRSettings(None, batch.global_batch_size, batch, 0))
        engine = scoped.engine
        with scoped.move, eval_loop.one_pass(self._readers(engine.strategy, batch, shuffle=False), inp,
                                        read_all=True) as reader:
            if _compat.on_batch_resets_metrics():
                engine.objective.reset()
            engine.steps.train(reader, 1)
            logs = engine.objective.results()
        return dict(sorted(logs.items())) if return_dict else logs_in_order(scoped.model, logs)

    def _test_on_batch(self, model, x, y=None, sample_weight=None, return_dict=False, *,
                       strategy: tf.distribute.Strategy, planned_batch: int | None = None) -> Any:
        """`model.test_on_batch`: the loss and metrics of one global batch, exact over its replicas (reset
        before it as `train_on_batch`'s)."""
        inp, batch = self._one_batch(strategy, x, y, sample_weight, training=False)
        stages.check_model(model, self.mixed_precision)
        scoped = self._model_in_scope(model, strategy, inp, batch)
        engine = scoped.engine
        with scoped.move, eval_loop.one_pass(self._readers(engine.eval_strategy, batch, shuffle=False), inp,
                                        read_all=True) as reader:
            if _compat.on_batch_resets_metrics():
                engine.objective.reset()
            engine.eval_steps.evaluate(reader, 1)
            logs = engine.objective.results("test_step")
        return dict(sorted(logs.items())) if return_dict else logs_in_order(scoped.model, logs)

    def _predict_on_batch(self, model, x, *, strategy: tf.distribute.Strategy, planned_batch: int | None = None):
        """`model.predict_on_batch`: the outputs of one global batch of features, split over the replicas."""
        rows = boundary.batch_rows(x, "x")
        dataset = tf.data.Dataset.from_tensor_slices(boundary.as_slices((x,))).batch(rows)
        return self._predict(model, dataset, verbose=0, strategy=strategy, planned_batch=rows)

    def _one_batch(self, strategy, x, y, sample_weight, *, training: bool,
                   class_weight=None) -> tuple[inputs_lib.Input, scaling.BatchPlan]:
        """One global batch given to a `*_on_batch` method, as an input of one step, and its batch plan."""
        rows = boundary.batch_rows(x, "x")
        data = (x, y, sample_weight)[:3 if sample_weight is not None else 2 if y is not None else 1]
        dataset = tf.data.Dataset.from_tensor_slices(boundary.as_slices(data)).batch(rows)
        workers = stages.workers(strategy, training=training)
        if training:
            inp, _ = boundary.fit_inputs(dataset, None, None, arg="x", class_weight=class_weight, shuffle=False,
                                         validation_split=0.0, validation_data=None, steps_per_epoch=None,
                                         is_chief=strategy_cluster_info(strategy).is_chief, **workers)
        else:
            inp = boundary.evaluate_input(dataset, None, None, arg="x", steps=None, **workers)
        return inp, scaling.BatchPlan(rows, strategy.num_replicas_in_sync)

    @contextlib.contextmanager
    def distribute(self, strategy: str | tf.distribute.Strategy | None = None) -> Iterator[Trainer]:
        """Inside the block, every Keras model's own `fit`, `evaluate` and `predict` run on this trainer.

        A tool that calls `model.fit` (a KerasTuner search, a script's own
        function) then trains under the trainer's strategy and exact
        aggregation, with no line changed; on this thread only, until the block ends.
        The calls keep `model.fit`'s contract: arrays without a `batch_size` get
        Keras's global batch of 32 (unless the Trainer was given a batch), the
        learning rate stays as compiled (unless the Trainer was given
        `lr_scaling`), and the Trainer adds no callback that changes what the
        user's see (no NaN guard: Keras's `TerminateOnNaN` is the user's choice).
        What the block adds is the strategy, exact aggregation and the plan,
        printed once per fit at verbose 1 or 2.

        ```python
        with trainer.distribute():
            tuner.search(x, y, epochs=3, validation_split=0.2)
        ```
        """
        strategy_lib.check_strategy_name(strategy)

        def engine(method: str, model: keras.Model, arguments: dict[str, Any]) -> Any:
            if (method in ("fit", "evaluate", "predict") and arguments.get("batch_size") is None
                    and not self._batch_given and boundary.is_arrays(arguments.get("x"))):
                arguments = {**arguments, "batch_size": KERAS_BATCH_SIZE}
            run = _quiet_tf_info(self._engine_for(method))
            keras_defaults = {"guard": False, "scale_lr": self._lr_scaling_given} if method == "fit" else {}
            return run(model, strategy=self._call_strategy(strategy, model, arguments), **arguments, **keras_defaults)

        with route_lib.routed(route_lib.Route(engine)):
            yield self

    # Stages ------------------------------------------------------------------

    def _engine_for(self, method: str) -> Callable[..., Any]:
        """The trainer's engine for Keras's `method`, which trainer/model/route.py names when a model's own
        method reaches Keras's."""
        return {
            "fit": self._fit, "evaluate": self._evaluate, "predict": self._predict,
            "train_on_batch": self._train_on_batch, "test_on_batch": self._test_on_batch,
            "predict_on_batch": self._predict_on_batch,
        }[method]

    def _through_model(self, method: str, model: Any, strategy: Any, arguments: dict[str, Any]) -> Any:
        """The model's own `method` called with the arguments given, Keras's own `method` running this trainer's
        engine (trainer/model/route.py); a builder, or anything but a Keras model, goes to the engine directly.

        Arrays get the Trainer's global batch as `batch_size` unless one was
        given, so that a model's own method that batches them (a KerasHub
        task) makes the Trainer's batches.
        """
        strategy = self._call_strategy(strategy, model, arguments)
        run = self._engine_for(method)
        if not _compat.is_model(model):
            return run(model, strategy=strategy, **arguments)
        planned = None
        if (arguments.get("batch_size") is None and boundary.is_arrays(arguments.get("x"))
                and route_lib.accepts(getattr(model, method), "batch_size")):
            planned = self._batch_plan(strategy)[0].global_batch_size
            arguments = {**arguments, "batch_size": planned}

        def engine(name: str, routed: keras.Model, handed: dict[str, Any]) -> Any:
            if planned is not None and handed.get("batch_size") == planned:
                del handed["batch_size"]  # handed down as it was passed: the Trainer's own plan
            return self._engine_for(name)(routed, strategy=strategy, planned_batch=planned, **handed)

        return route_lib.call_model(model, method, arguments, engine)

    def _call_strategy(self, strategy, model: Any = None, arguments: dict[str, Any] | None = None
                       ) -> tf.distribute.Strategy:
        """The strategy a call runs on: the one its data was distributed with, else fit's, else the Trainer's,
        else the one whose scope the call sits in, else the one the model was built in.

        As under `model.fit`, the Trainer's "auto" takes the strategy of the
        user's `with strategy.scope():` the call sits in, else the one whose
        scope the model was built in; "multi_worker" takes such a
        MultiWorkerMirroredStrategy (TensorFlow runs one per process). TensorFlow
        runs one strategy's scope at a time: inside a user's scope, a name the
        strategy fits (a "mirrored" Trainer inside a MirroredStrategy's scope
        over the same devices) takes it too, and any other strategy is refused
        before anything runs.
        """
        setting = self.strategy if strategy is None else strategy
        ambient = ambient_strategy()
        carried = data_strategy(arguments or {})
        if carried is not None:
            return self._data_strategy(setting, carried, ambient)
        given = ambient or model_home(model)
        if given is not None and takes(setting, given):
            collectives.claim_group_keys(given)
            return given
        resolved = self._resolve_strategy(strategy)
        if ambient is None or ambient is resolved:
            return resolved
        if isinstance(setting, str) and same_layout(ambient, resolved):
            collectives.claim_group_keys(ambient)
            return ambient
        raise ValueError(
            f"`strategy` must be the strategy whose scope this call sits in: TensorFlow runs one strategy's scope "
            f"at a time. Received: strategy={setting!r} ({strategy_label(resolved)}) inside the scope of "
            f"{strategy_label(ambient)}. Call the trainer after the `with strategy.scope():` block (a model built "
            "there trains in place on any strategy), or pass that strategy: Trainer(strategy=strategy)."
        )

    def _data_strategy(self, setting, carried: tf.distribute.Strategy, ambient) -> tf.distribute.Strategy:
        """The strategy a DistributedDataset carries, which the call runs on, unless it was asked for another.

        As under `model.fit` in that strategy's scope: "auto" takes it, and so does the
        strategy object itself or a name of the same kind over the same devices.
        """
        if ambient is not None and ambient is not carried:
            received = f"a call inside the scope of {strategy_label(ambient)}"
        elif setting is carried or takes(setting, carried) or (
                isinstance(setting, str) and same_layout(self._resolve_strategy(setting), carried)):
            collectives.claim_group_keys(carried)
            return carried
        else:
            received = f"strategy={setting!r}"
            if isinstance(setting, tf.distribute.Strategy):
                received = f"strategy=another {strategy_label(setting)} object"
        raise ValueError(
            f"The data was distributed with {strategy_label(carried)}, and a tf.distribute.DistributedDataset runs "
            f"on the strategy that made it. Received: {received}. Leave the Trainer's strategy at 'auto' (or pass "
            "Trainer(strategy=strategy), the same object), or pass the tf.data.Dataset or the dataset function "
            "undistributed: the trainer distributes it."
        )

    def _resolve_strategy(self, strategy) -> tf.distribute.Strategy:
        strategy_lib.check_strategy_name(strategy)
        key = strategy if strategy is not None else self.strategy
        if not isinstance(key, tf.distribute.Strategy) and key not in self._strategies:
            self._strategies[key] = strategy_lib.resolve_strategy(key)  # one instance per name
        resolved = key if isinstance(key, tf.distribute.Strategy) else self._strategies[key]
        collectives.claim_group_keys(resolved)
        return resolved

    def _batch_plan(self, strategy: tf.distribute.Strategy, inp: inputs_lib.Input | None = None,
                    batch_size: int | None = None, planned_batch: int | None = None) -> tuple[scaling.BatchPlan, str]:
        """The global batch, and where it came from when not from the Trainer ("" then).

        Batches the user made (a batched dataset, generator or PyDataset) are
        the global batches, as under `model.fit`; else a `batch_size` given to
        fit/evaluate/predict wins over the Trainer's settings. `planned_batch`
        is the Trainer's batch handed to the model's own method, which batched
        the data with it: batches of that size are the Trainer's.
        """
        replicas = strategy.num_replicas_in_sync
        if isinstance(inp, inputs_lib.BatchedInput) and inp.full_batch_size() != (planned_batch or 0):
            return scaling.BatchPlan(inp.full_batch_size(), replicas), f"the {inp.form}'s batches"
        if isinstance(inp, inputs_lib.FunctionInput):
            made = scaling.BatchPlan(inp.global_batch_size(strategy), replicas)
            self._check_function_batch(made, batch_size)
            return made, "the dataset function's batches"
        if batch_size is not None:
            unused = ("" if not self._batch_given else
                      f"; Trainer's {'batch_size' if self.batch_size else 'per_replica_batch_size'} not used")
            return (scaling.plan_batch(per_replica_batch_size=None, batch_size=batch_size, num_replicas=replicas),
                    f"fit's batch_size={batch_size}{unused}")
        return scaling.plan_batch(per_replica_batch_size=self.per_replica_batch_size, batch_size=self.batch_size,
                                  num_replicas=replicas), ""

    def _check_function_batch(self, made: scaling.BatchPlan, batch_size: int | None) -> None:
        """Refuses a batch given explicitly (to the call or the Trainer) that a dataset function's batches
        contradict: the function batches its own data, and the steps run its batches."""
        if batch_size is not None:
            asked, arg = scaling.BatchPlan(batch_size, made.num_replicas), "batch_size"
            name = f"fit's batch_size={batch_size}"
        elif self._batch_given:
            asked = scaling.plan_batch(per_replica_batch_size=self.per_replica_batch_size, batch_size=self.batch_size,
                                       num_replicas=made.num_replicas)
            arg = "batch_size" if self.batch_size is not None else "per_replica_batch_size"
            name = f"Trainer({arg}={getattr(self, arg)})"
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
        if batch_source and self._base_given is None:
            return batch.global_batch_size
        return self.base_batch_size

    def _warmup_steps(self, steps_per_epoch: int | None) -> int:
        if not self.warmup_epochs:
            return self.warmup_steps
        if steps_per_epoch is None:
            raise ValueError(
                f"`warmup_epochs` needs a known epoch length. Received: warmup_epochs={self.warmup_epochs} "
                "with data of unknown size. Pass warmup_steps, or steps_per_epoch to fit()."
            )
        return int(round(self.warmup_epochs * steps_per_epoch))

    def _schedule(self, strategy: tf.distribute.Strategy, train: inputs_lib.Input, batch_size: int | None,
                  planned_batch: int | None, steps_per_epoch: int | None, scale_lr: bool = True) -> calls.Schedule:
        """The global batch, the steps an epoch runs, the warmup and the learning-rate settings (the rate as
        compiled unless `scale_lr`)."""
        batch, source = self._batch_plan(strategy, train, batch_size, planned_batch)
        user_steps = checks.steps_within_arrays(train, steps_per_epoch, batch.global_batch_size)
        steps_per_epoch = user_steps or train.num_steps(batch.global_batch_size)
        warmup_steps = self._warmup_steps(steps_per_epoch)
        lr = engine_lib.LRSettings(self.lr_scaling if scale_lr else None, self._base_batch_size(batch, source),
                                   batch, warmup_steps)
        return calls.Schedule(batch, source, user_steps, steps_per_epoch, lr)

    def _model_in_scope(self, model, strategy, inp, batch: scaling.BatchPlan,
                        lr: engine_lib.LRSettings | None = None) -> calls.Scoped:
        """The checks are done, so the process may change now (`malloc`), and the model goes into the
        strategy's scope for the call (`Scoped.move` brings it back), built on the first of `batch`'s steps."""
        process = malloc.tune_process(self.tune_malloc)
        model, engine, lr_plan, move = engine_lib.prepare(
            model, strategy, inp, global_batch_size=batch.global_batch_size, seed=self.seed,
            jit_compile=self.jit_compile, cache=self._engines, in_scope=self._in_scope, lr=lr,
            mixed_precision=self.mixed_precision, batch_norm=self.batch_norm)
        return calls.Scoped(model, engine, lr_plan, move, process)

    def _run_epochs(self, engine: engine_lib.Engine, context: loop.TrainContext, call: calls.FitCall,
                    model: keras.Model, train: inputs_lib.Input, val: inputs_lib.Input | None,
                    schedule: calls.Schedule, guard: bool = True) -> History:
        """The epochs with the callbacks: steps read on this process's replicas, or scheduled under
        parameter-server training; returns the history."""
        history = History()
        callback_list = self._callback_list(call.callbacks + [history], context, model, call.verbose, guard)
        validation = None
        if val is not None:
            validation = loop.Validation(val, call.validation_freq, call.validation_steps,
                                         self._batch_plan(context.strategy, val, call.validation_batch_size)[0])
            validation.make_reader = self._readers(engine.eval_strategy, validation.batch)
        if is_parameter_server(engine.strategy):
            coordinator = self._coordinator(engine.strategy)
            iterator = ps.per_worker_iterator(engine.strategy, coordinator, train, schedule.batch.global_batch_size,
                                              num_workers=context.plan.num_workers)
            passes = Passes.starting_at(call.initial_epoch, context.plan.steps_per_epoch, None)
            source = ps.ScheduledSteps(coordinator, engine.steps, engine.eval_steps, iterator, passes)
        else:
            readers = self._readers(engine.strategy, schedule.batch, call.shuffle)
            passes = Passes.starting_at(call.initial_epoch, schedule.user_steps,
                                        train.num_steps(schedule.batch.global_batch_size),
                                        callback_hooks.keras_steps_per_call(engine.steps.model))
            source = loop.ReaderSteps(engine.steps, readers, train, passes=passes, epochs=context.epochs)
        loop.run_epochs(source, context, callback_list, validation, engine.eval_steps)
        if context.fusion.auto and context.fusion.seconds_per_step is not None:
            engine.seconds_per_step[schedule.batch.global_batch_size] = context.fusion.seconds_per_step
        return history

    def _callback_list(self, callbacks: list, context: loop.TrainContext, model, verbose: int, guard: bool = True):
        """The user's callbacks plus the defaults, each given the TrainContext if it asks."""
        callbacks = self._default_callbacks(callbacks, verbose, guard)
        for callback in callbacks:
            if hasattr(callback, "set_trainer_context"):
                callback.set_trainer_context(context)
        return keras.callbacks.CallbackList(
            callbacks, model=model, verbose=verbose, epochs=context.epochs, steps=context.plan.steps_per_epoch
        )

    def _default_callbacks(self, callbacks: list, verbose: int, guard: bool = True) -> list:
        """NanGuard (unless turned off, or not `guard`) and a ProgressBar for verbose 1 or 2, unless given."""
        from trainer.callbacks import NanGuard, ProgressBar  # callbacks/ builds on trainer/

        extra = []
        if self.nan_guard and guard and not any(isinstance(c, NanGuard) for c in callbacks):
            if self._nan_guard is None:  # one for every fit: it keeps its traced reader of the variables
                self._nan_guard = NanGuard()
            extra.append(self._nan_guard)
        if verbose and not any(isinstance(c, ProgressBar) for c in callbacks):
            extra.append(ProgressBar(mode="auto" if verbose == 1 else "epoch"))
        return extra + callbacks

    def _readers(self, strategy: tf.distribute.Strategy, batch: scaling.BatchPlan,
                 shuffle: bool | None = None) -> inputs_lib.Readers:
        """Input -> what step calls read from it, under `strategy` with `batch`'s global batch."""
        return inputs_lib.Readers(strategy, batch.global_batch_size,
                                  shuffle=self.shuffle if shuffle is None else shuffle, seed=self._shuffle_seed)

    def _coordinator(self, strategy: tf.distribute.Strategy):
        for known, coordinator in self._coordinators:  # one coordinator per strategy
            if known is strategy:
                return coordinator
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        self._coordinators.append((strategy, coordinator))
        return coordinator

    def _predict_steps(self, model: keras.Model, strategy: tf.distribute.Strategy) -> Steps:
        for engine in self._engines:
            if engine.steps.model is model and engine.eval_strategy is strategy:
                return engine.eval_steps
        return Steps(strategy, model, objective=None)
