"""What runs beneath Keras's fit, evaluate and predict for a Trainer: one method per Keras method, each its
stages in order (trainer/stages.py), every check before anything changes; and the state they keep from one
call to the next. The Trainer owns one `Runs` and routes Keras's methods to it (`Trainer._engine_for`)."""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from trainer import _compat, calls, checks, options, scaling, stages
from trainer.batching import Batching
from trainer.data import boundary
from trainer.data import inputs as inputs_lib
from trainer.data.passes import Passes
from trainer.distribute.cluster import cluster_info, is_parameter_server, strategy_cluster_info
from trainer.engine import callback_hooks, eval_loop, loop, malloc, ps
from trainer.engine import engine as engine_lib
from trainer.engine.context import TrainContext
from trainer.engine.steps import Steps
from trainer.history import History
from trainer.model import models, placement
from trainer.model.own_steps import logs_in_order


class Runs:
    """Keras's methods run on a strategy, with the Trainer's settings read at each call.

    Args:
      settings: the Trainer whose public settings each call reads; never written.
      batching: its batch and learning-rate settings (`Batching`).
      shuffle_seed: the seed of every fit's shuffle of arrays.

    Attributes:
      engines: the steps built for each model and strategy, reused by the next call (`engine.prepare`).
      in_scope: the in-scope backings made for the user's models (`models.InScope`).
    """

    def __init__(self, settings: options.Settings, batching: Batching, *, shuffle_seed: int):
        self.settings = settings
        self.batching = batching
        self.shuffle_seed = shuffle_seed
        self.engines: list[engine_lib.Engine] = []
        self.in_scope = models.InScope()
        self._coordinators: list[tuple[tf.distribute.Strategy, Any]] = []
        self._nan_guard = None  # the default NanGuard, made at the first fit and kept: it keeps its traced reader

    def fit(self, model, x=None, y=None, *, batch_size=None, epochs=1, verbose=None, callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=None, class_weight=None, sample_weight=None,
            initial_epoch=0, steps_per_epoch=None, validation_steps=None, validation_batch_size=None,
            validation_freq=1, strategy: tf.distribute.Strategy, planned_batch: int | None = None,
            guard: bool = True, scale_lr: bool = True) -> History:
        """fit, with the arguments Keras's own fit received (`Trainer.fit` documents them). `guard`: the
        Trainer's NaN guard may join the callbacks; `scale_lr`: its learning-rate rule may apply (neither
        under `Trainer.distribute()`, where `model.fit`'s contract holds, unless the Trainer was given
        `lr_scaling`)."""
        settings = self.settings
        call = stages.checked_fit_call(
            callbacks, strategy, batch_size=batch_size, validation_split=validation_split,
            validation_freq=validation_freq, validation_batch_size=validation_batch_size,
            validation_steps=validation_steps, class_weight=class_weight, epochs=epochs, initial_epoch=initial_epoch,
            steps_per_epoch=steps_per_epoch, shuffle=settings.shuffle if shuffle is None else shuffle,
            verbose=settings.verbose if verbose is None else verbose)
        train, val = stages.fit_data(call, x, y, sample_weight, strategy, class_weight=class_weight,
                                     validation_split=validation_split, validation_data=validation_data,
                                     seed=settings.seed)
        stages.check_model(model, settings.mixed_precision)
        schedule = self.batching.schedule(strategy, train, batch_size, planned_batch, call.steps_per_epoch, scale_lr)
        if settings.data_sharding == "files":
            train = stages.by_file_shards(train, strategy, schedule, shards=settings.file_shards,
                                          steps_per_epoch=call.steps_per_epoch)
        model = checks.check_fit(model, train, val, batch=schedule.batch, epoch_steps=schedule.steps_per_epoch,
                                 epochs=call.epochs, initial_epoch=call.initial_epoch,
                                 warmup=(settings.warmup_epochs, schedule.lr.warmup_steps))
        scoped = self._model_in_scope(model, strategy, train, schedule.batch, lr=schedule.lr)
        engine = scoped.engine
        with scoped.move:  # on the way out the user's model goes home with its trained state, as after model.fit
            steps, steps_source = stages.fusion(settings.steps_per_execution, engine, schedule.batch,
                                                schedule.steps_per_epoch, call.callbacks)
            plan = stages.fit_plan(strategy, train, schedule, scoped.lr_plan, steps, scoped.model,
                                   jit=engine.steps.xla, jit_note=engine.jit_note, sources=(steps_source,),
                                   process=scoped.process, moved=scoped.move.describe(),
                                   unguarded=callback_hooks.unguarded(call.callbacks),
                                   resumes=any(getattr(c, "resumes", False) for c in call.callbacks),
                                   draws={**engine.eval_steps.named_draws, **engine.steps.named_draws})
            context = TrainContext(strategy, strategy_cluster_info(strategy), plan, epochs=call.epochs,
                                        initial_epoch=call.initial_epoch, fusion=steps, lr_plan=scoped.lr_plan)
            stages.announce(plan, verbose=call.verbose, is_chief=context.is_chief)
            return self._run_epochs(engine, context, call, scoped.model, train, val, schedule, guard)

    def evaluate(self, model, x=None, y=None, *, batch_size=None, verbose=None, sample_weight=None, steps=None,
                 callbacks=None, return_dict=False, strategy: tf.distribute.Strategy,
                 planned_batch: int | None = None, **unknown) -> float | list[float] | dict[str, float]:
        """evaluate, with the arguments Keras's own evaluate received."""
        if unknown:
            raise TypeError(f"`evaluate` got arguments Keras's evaluate does not take. Received: {sorted(unknown)}. "
                            "Pass only what model.evaluate takes.")
        call = self._one_pass("evaluate", model, x, y, sample_weight, batch_size=batch_size, steps=steps,
                              callbacks=callbacks, strategy=strategy, planned_batch=planned_batch)
        scoped = self._model_in_scope(call.model, strategy, call.inp, call.batch)
        with scoped.move:
            known = call.inp.num_steps(call.batch.global_batch_size)
            callback_list = self._one_pass_callbacks(call, scoped.model, verbose, known)
            readers = self._readers(scoped.engine.eval_strategy, call.batch)
            logs = eval_loop.run_eval(scoped.engine.eval_steps, readers, call.inp, callback_list,
                                      num_steps=call.steps, known_steps=known)
        return dict(sorted(logs.items())) if return_dict else logs_in_order(scoped.model, logs)  # sorted, as Keras's

    def predict(self, model, x, *, batch_size=None, verbose=None, steps=None, callbacks=None,
                strategy: tf.distribute.Strategy, planned_batch: int | None = None) -> Any:
        """predict, with the arguments Keras's own predict received."""
        call = self._one_pass("predict", model, x, None, None, batch_size=batch_size, steps=steps,
                              callbacks=callbacks, strategy=strategy, planned_batch=planned_batch)
        malloc.tune_process(self.settings.tune_malloc)
        model = models.from_builder(call.model, strategy, self.settings.seed, self.settings.mixed_precision,
                                    self.in_scope)
        sample_x = engine_lib.sample_batch(model, call.inp, call.batch.global_batch_size,
                                           strategy.num_replicas_in_sync)
        with placement.move_in(model, strategy, self.in_scope.table(model, strategy), sample_x, targets=False):
            if is_parameter_server(strategy):
                strategy = tf.distribute.get_strategy()  # inline on the coordinator
            known = call.inp.num_steps(call.batch.global_batch_size)
            callback_list = self._one_pass_callbacks(call, model, verbose, known)
            with eval_loop.one_pass(self._readers(strategy, call.batch), call.inp,
                                    read_all=call.steps is None) as reader:
                outputs = eval_loop.run_predict(self._predict_steps(model, strategy).predictions(reader),
                                                callback_list, num_steps=call.steps, known_steps=known)
        return eval_loop.joined(outputs)

    # Keras's per-batch methods, reached beneath a model's own code (`Trainer.distribute()`, a routed call).

    def train_on_batch(self, model, x, y=None, sample_weight=None, class_weight=None, return_dict=False, *,
                       strategy: tf.distribute.Strategy, planned_batch: int | None = None) -> Any:
        """`model.train_on_batch`: one optimizer step on the global batch, split over the replicas with each
        weighed by its share (exact); the metrics over this batch alone, or accumulated since the last reset
        where the installed Keras's do (`_compat.on_batch_resets_metrics`)."""
        inp, batch = self._one_batch(strategy, x, y, sample_weight, class_weight=class_weight, training=True)
        return self._step_on_batch(model, strategy, inp, batch, training=True, return_dict=return_dict)

    def test_on_batch(self, model, x, y=None, sample_weight=None, return_dict=False, *,
                      strategy: tf.distribute.Strategy, planned_batch: int | None = None) -> Any:
        """`model.test_on_batch`: the loss and metrics of one global batch, exact over its replicas (reset
        before it as `train_on_batch`'s)."""
        inp, batch = self._one_batch(strategy, x, y, sample_weight, training=False)
        return self._step_on_batch(model, strategy, inp, batch, training=False, return_dict=return_dict)

    def predict_on_batch(self, model, x, *, strategy: tf.distribute.Strategy, planned_batch: int | None = None):
        """`model.predict_on_batch`: the outputs of one global batch of features, split over the replicas."""
        rows = boundary.batch_rows(x, "x")
        dataset = tf.data.Dataset.from_tensor_slices(boundary.as_slices((x,))).batch(rows)
        return self.predict(model, dataset, verbose=0, strategy=strategy, planned_batch=rows)

    # The stages the methods share.

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
        stages.check_model(model, self.settings.mixed_precision, compiled=method == "evaluate")
        batch, _ = self.batching.plan(strategy, inp, batch_size, planned_batch)
        check = checks.check_evaluate if method == "evaluate" else checks.check_predict
        return calls.OnePass(check(model, inp, batch=batch), inp, batch, steps, callbacks)

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

    def _step_on_batch(self, model, strategy, inp: inputs_lib.Input, batch: scaling.BatchPlan, *, training: bool,
                       return_dict: bool) -> Any:
        """One step on `inp`'s one global batch, trained on or evaluated; its logs as Keras's `*_on_batch`
        return them."""
        stages.check_model(model, self.settings.mixed_precision)
        lr = engine_lib.LRSettings(None, batch.global_batch_size, batch, 0) if training else None
        scoped = self._model_in_scope(model, strategy, inp, batch, lr=lr)
        engine = scoped.engine
        readers = self._readers(engine.strategy if training else engine.eval_strategy, batch, shuffle=False)
        with scoped.move, eval_loop.one_pass(readers, inp, read_all=True) as reader:
            if _compat.on_batch_resets_metrics():
                engine.objective.reset()
            if training:
                engine.steps.train(reader, 1)
                logs = engine.objective.results()
            else:
                engine.eval_steps.evaluate(reader, 1)
                logs = engine.objective.results("test_step")
        return dict(sorted(logs.items())) if return_dict else logs_in_order(scoped.model, logs)

    def _model_in_scope(self, model, strategy, inp, batch: scaling.BatchPlan,
                        lr: engine_lib.LRSettings | None = None) -> calls.Scoped:
        """The checks are done, so the process may change now (`malloc`), and the model goes into the
        strategy's scope for the call (`Scoped.move` brings it back), built on the first of `batch`'s steps."""
        settings = self.settings
        process = malloc.tune_process(settings.tune_malloc)
        model, engine, lr_plan, move = engine_lib.prepare(
            model, strategy, inp, global_batch_size=batch.global_batch_size, seed=settings.seed,
            jit_compile=settings.jit_compile, cache=self.engines, in_scope=self.in_scope, lr=lr,
            mixed_precision=settings.mixed_precision, batch_norm=settings.batch_norm)
        return calls.Scoped(model, engine, lr_plan, move, process)

    def _run_epochs(self, engine: engine_lib.Engine, context: TrainContext, call: calls.FitCall,
                    model: keras.Model, train: inputs_lib.Input, val: inputs_lib.Input | None,
                    schedule: calls.Schedule, guard: bool = True) -> History:
        """The epochs with the callbacks: steps read on this process's replicas, or scheduled under
        parameter-server training; returns the history."""
        history = History()
        callbacks = self._default_callbacks(call.callbacks, call.verbose, guard) + call.callbacks + [history]
        for callback in callbacks:
            if hasattr(callback, "set_trainer_context"):
                callback.set_trainer_context(context)
        callback_list = keras.callbacks.CallbackList(callbacks, model=model, verbose=call.verbose,
                                                     epochs=context.epochs, steps=context.plan.steps_per_epoch)
        validation = None
        if val is not None:
            validation = loop.Validation(val, call.validation_freq, call.validation_steps,
                                         self.batching.plan(context.strategy, val, call.validation_batch_size)[0])
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

    def _default_callbacks(self, callbacks: list, verbose: int, guard: bool = True) -> list:
        """NanGuard (unless turned off, or not `guard`) and a ProgressBar for verbose 1 or 2, unless given."""
        from trainer.callbacks import NanGuard, ProgressBar  # callbacks/ builds on trainer/

        extra = []
        if self.settings.nan_guard and guard and not any(isinstance(c, NanGuard) for c in callbacks):
            if self._nan_guard is None:
                self._nan_guard = NanGuard()
            extra.append(self._nan_guard)
        if verbose and not any(isinstance(c, ProgressBar) for c in callbacks):
            extra.append(ProgressBar(mode="auto" if verbose == 1 else "epoch"))
        return extra

    def _one_pass_callbacks(self, call: calls.OnePass, model: keras.Model, verbose: Any,
                            known_steps: int | None) -> keras.callbacks.CallbackList:
        """`evaluate`'s or `predict`'s callbacks, with the params Keras's give them (one epoch of its steps), and
        Keras's own progress bar as `model.evaluate` and `model.predict` show it: at Keras's "auto" (1) and 1
        or 2, on the chief only; `verbose` unset, the Trainer's verbosity decides."""
        callbacks = call.callbacks
        if (self.settings.verbose if verbose is None else verbose) not in (0, False) and cluster_info().is_chief:
            bar = keras.callbacks.ProgbarLogger()
            bar.handles_fused_steps = True  # it draws from the step index it is given, so calls may fuse steps
            bar.reads_batch_logs = False  # the chief's alone: the metrics are read for it at the pass's end only
            callbacks = callbacks + [bar]
        return keras.callbacks.CallbackList(callbacks, model=model, verbose="auto" if verbose is None else verbose,
                                            epochs=1, steps=known_steps if call.steps is None else call.steps)

    def _readers(self, strategy: tf.distribute.Strategy, batch: scaling.BatchPlan,
                 shuffle: bool | None = None) -> inputs_lib.Readers:
        """Input -> what step calls read from it, under `strategy` with `batch`'s global batch."""
        return inputs_lib.Readers(strategy, batch.global_batch_size,
                                  shuffle=self.settings.shuffle if shuffle is None else shuffle,
                                  seed=self.shuffle_seed)

    def _coordinator(self, strategy: tf.distribute.Strategy):
        for known, coordinator in self._coordinators:  # one coordinator per strategy
            if known is strategy:
                return coordinator
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        self._coordinators.append((strategy, coordinator))
        return coordinator

    def _predict_steps(self, model: keras.Model, strategy: tf.distribute.Strategy) -> Steps:
        for engine in self.engines:
            if engine.steps.model is model and engine.eval_strategy is strategy:
                return engine.eval_steps
        return Steps(strategy, model, objective=None)
