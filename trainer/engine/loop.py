"""The epoch loop: callbacks around fused step calls (evaluation's and prediction's: `eval_loop`). What
callbacks may see of it is its `TrainContext` (`context.py`)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from typing import Any, Callable, ContextManager, Protocol

import keras

from trainer import _compat
from trainer.data.marks import Mark, Place, Reading
from trainer.data.passes import RAN_OUT, Passes
from trainer.distribute.faults import explained_collective_errors
from trainer.engine.callback_hooks import overrides_batch_hooks
from trainer.engine.context import TrainContext
from trainer.engine.eval_loop import MakeReader, release, run_eval
from trainer.engine.past_end import PastEnd
from trainer.engine.steps import Steps
from trainer.user_line import user_stacklevel


@dataclasses.dataclass
class Validation:
    """What fit validates on, and when: after every `freq`-th epoch (or the epochs `freq` lists, from 1), at
    most `steps` steps of `batch`."""

    inp: Any
    freq: Any = 1
    steps: int | None = None
    batch: Any = None  # its scaling.BatchPlan
    make_reader: MakeReader | None = None  # set by the Trainer for the evaluation strategy

    def due(self, epoch: int) -> bool:
        """Whether to validate at the end of `epoch` (as Keras counts: epochs freq, 2 freq, ..., or those listed)."""
        if isinstance(self.freq, (list, tuple)):
            return epoch + 1 in self.freq
        return (epoch + 1) % self.freq == 0


class StepSource(Protocol):
    """What the epoch loop runs steps with: `ReaderSteps` (synchronous strategies) or `ps.ScheduledSteps`."""

    steps: Steps  # the train steps (their model, warmup)
    objective: Any  # whose results are the train logs
    passes: Passes  # where each epoch reads, as Keras's epoch iterator cuts the input

    def begin(self, context: TrainContext) -> None:
        """Called once, after `on_train_begin`."""

    def epoch(self, epoch: int, first_step: int) -> ContextManager[Callable[[int], int]]:
        """Around one epoch, begun in `passes`: gives `run(n) -> steps run` (fewer when the data ran out)."""

    def end(self) -> None:
        """Called once, after `on_train_end`."""


class ReaderSteps:
    """Steps read from the input on this process's replicas (every strategy but parameter-server training).

    Arrays are read through one reader across epochs, which shuffles each pass;
    other inputs get a reader for each pass that `passes` begins. While a
    callback resumes the fit (`TrainContext.resumable`), the readers mark
    their places (`trainer/data/marks.py`) and `context.reading` says where
    the reading is at each step boundary; a resumed fit's first reader starts
    at `context.initial_reading`.
    """

    def __init__(self, steps: Steps, make_reader: MakeReader, inp: Any, *, passes: Passes, epochs: int):
        self.steps, self.make_reader, self.inp = steps, make_reader, inp
        self.passes, self.epochs = passes, epochs
        self._past_end: PastEnd | None = None
        self.objective = steps.objective
        self._held: list = []  # the reader, alone, so that `release` can destroy it off the main thread
        self._epoch = 0
        self._fresh_and_empty = False  # a reader made for this pass that has not given a step yet
        self._context: TrainContext | None = None  # while a callback resumes the fit: it marks its reads
        self._mark: Mark | None = None  # the latest mark of the reader's place
        self._resume_from: Mark | None = None  # a backup's mark, for the resumed fit's first reader

    def begin(self, context: TrainContext) -> None:
        # after a resume's restore; only where the installed Keras's own fit calls past the end
        if self.passes.pass_steps is None and self.inp.unknown_to_keras and _compat.one_step_calls_past_end():
            self._past_end = PastEnd(self.steps.model)
        if context.resumable and self.inp.reader_per_pass:  # arrays' places follow from the seed and the step
            self._context = context

    @contextlib.contextmanager
    def epoch(self, epoch: int, first_step: int):
        self.inp.epoch_begin()
        self._epoch = epoch
        saved = self._context.initial_reading if self._context is not None else None
        if saved is not None:  # a backup's: the first epoch starts where the backed-up run was
            self._context.initial_reading = None
            placed = self.passes.resume_at(epoch, first_step, saved.index, saved.step, saved.spent)
            self._mark = self._resume_from = saved.mark
        else:
            placed = self.passes.begin_epoch(epoch, first_step)
        if self.passes.spent:
            pass  # resumed after the pass's last step: no reader, whose read-ahead would take the next pass's
        elif not self._held or (placed and self.inp.reader_per_pass):
            # Arrays: one reader for the passes the remaining epochs can read (at most one new pass each).
            self._new_reader(epoch=self.passes.index, start_step=self.passes.step,
                             until=self.passes.index + self.epochs - epoch)
        elif self._context is not None and self.passes.pass_steps is None and hasattr(self._held[0], "mark_here"):
            # a stream read on into this epoch: a mark here, so a resume reads on from this epoch's start
            self._mark = self._held[0].mark_here(self.passes.index, self.passes.step) or self._mark
        self._note_reading()
        try:
            yield self.run
        except BaseException:
            self.inp.epoch_end(read_all=False)  # stops a PyDataset's worker threads or processes
            raise
        if self._past_end is not None and self.passes.called_past_end:
            self._past_end.apply()  # what model.fit's call past the end changes without a batch
        if self.passes.spent and self.inp.reader_per_pass:
            release(self._held)
        started = self.inp.epoch_end(read_all=self.passes.steps_per_epoch is None)
        if started and self._mark is not None:  # each moves a reshuffling seed generator on, as Keras's does
            self._mark = dataclasses.replace(self._mark, inits_after=self._mark.inits_after + len(started))
        release(started)
        self._note_reading()

    def run(self, num_steps: int) -> int:
        ran = self.steps.train(self._held[0], num_steps)
        self._note_reading(ran)
        if self._past_end is not None:
            self._past_end.took(ran)
        if ran:
            self._fresh_and_empty = False
        elif self._fresh_and_empty:
            raise ValueError(
                f"`data` produced no batches in epoch {self._epoch}. Pass a non-empty dataset, "
                "or one that repeats when steps_per_epoch is set."
            )
        return ran

    def _new_reader(self, **where) -> None:
        release(self._held)
        if self._context is not None:
            # Only a resumed fit's first reader starts from a backup's mark; the uninterrupted passes start afresh.
            layout = (self._context.plan.num_replicas, self._context.plan.num_workers)
            where["place"] = Place(self.passes.index, self.passes.step, self._resume_from, layout)
            self._resume_from = None
        self._held.append(self.make_reader(self.inp, **where))
        self._mark = getattr(self._held[0], "mark", None)
        self._fresh_and_empty = self.passes.step == 0  # a resumed place past the start had batches before it

    def _note_reading(self, ran: int = 0) -> None:
        """Tells the context where the reading is (`context.reading`), `ran` steps on from `passes`' count:
        a call's steps are counted in `passes` after it returns."""
        if self._context is not None:
            passes = self.passes
            self._context.reading = Reading(passes.index, passes.step + ran, passes.spent, self._mark)

    def end(self) -> None:
        release(self._held)


def run_epochs(
    source: StepSource,
    context: TrainContext,
    callbacks: keras.callbacks.CallbackList,
    validation: Validation | None,
    eval_steps: Steps,
) -> dict[str, Any]:
    """Trains from `context.initial_epoch` to `context.epochs`; returns the last logs.

    The one epoch loop, for every strategy: `source` runs a call's worth of
    steps; `eval_steps` validates.
    """
    try:
        return _run_epochs(source, context, callbacks, validation, eval_steps)
    finally:
        while context.on_leave:
            context.on_leave.pop()()


def _run_epochs(source: StepSource, context: TrainContext, callbacks: keras.callbacks.CallbackList,
                validation: Validation | None, eval_steps: Steps) -> dict[str, Any]:
    model, objective = source.steps.model, source.objective
    batch_logs = any(overrides_batch_hooks(c) for c in callbacks.callbacks)
    keep_states = any(getattr(c, "resumes", False) for c in callbacks.callbacks)
    model.stop_training = False
    callbacks.on_train_begin()  # a resuming callback may move initial_epoch/initial_step here
    resumed = _compat.requested_initial_epoch(model)  # Keras's own BackupAndRestore, as model.fit reads it
    if resumed:
        context.initial_epoch, context.initial_step = resumed, 0
    source.steps.sync_warmup()
    context.resumable = keep_states
    source.begin(context)
    logs: dict[str, Any] = {}
    with explained_collective_errors(context):  # the steps, the metric reads and validation all gather
        for epoch in range(context.initial_epoch, context.epochs):
            first_step = context.initial_step if epoch == context.initial_epoch else 0
            context.epoch, context.step = epoch, first_step
            objective.reset()
            if first_step and context.initial_metric_states is not None:
                _resume_metrics(objective, context)
            callbacks.on_epoch_begin(epoch)
            with source.epoch(epoch, first_step) as run_steps:
                _train_epoch(run_steps, source.passes, model, objective, context, callbacks, batch_logs,
                             keep_states)
            logs = end_epoch(epoch, objective, eval_steps, validation, callbacks)
            context.run_deferred()
            if model.stop_training:
                break
        end_training(model, context, callbacks, logs)
    source.end()
    return logs


def _resume_metrics(objective, context: TrainContext) -> None:
    """Puts back the metric totals of the step training resumes at, so the epoch logs all of its steps."""
    if objective.states_fit(context.initial_metric_states):
        objective.restore_states(context.initial_metric_states, context.is_chief)
    elif context.is_chief:
        warnings.warn(f"The backup's metric totals do not fit this model's metrics (another compile?), so the "
                      f"metrics logged for epoch {context.initial_epoch} cover only the steps from "
                      f"{context.initial_step} on. The weights resume exactly.", stacklevel=user_stacklevel())


def end_training(model: keras.Model, context: TrainContext, callbacks: keras.callbacks.CallbackList, logs) -> None:
    """Ends training as `model.fit` does: the optimizer's final values (EMA weights), then `on_train_end`."""
    if isinstance(model.optimizer, keras.optimizers.Optimizer) and context.epochs > 0:
        with _compat.replica_hooks():  # the EMA overwrite updates through the strategy, as the step does
            model.optimizer.finalize_variable_values(model.trainable_weights)
    callbacks.on_train_end(logs)


def end_epoch(epoch: int, objective, eval_steps: Steps, validation: Validation | None, callbacks) -> dict:
    """Reads the epoch's train logs, validates when due, and calls `on_epoch_end`; returns the logs."""
    logs = objective.results()  # Keras's keys only: its learning-rate callbacks add `learning_rate` themselves
    if validation is not None and validation.due(epoch):
        val_logs = run_eval(eval_steps, validation.make_reader, validation.inp, callbacks, validation.steps,
                            validation.inp.num_steps(validation.batch.global_batch_size))
        logs.update({f"val_{k}": v for k, v in val_logs.items()})
    callbacks.on_epoch_end(epoch, logs)
    return logs


def _train_epoch(run_steps: Callable[[int], int], passes: Passes, model: keras.Model, objective,
                 context: TrainContext, callbacks, batch_logs: bool, keep_states: bool) -> None:
    """Runs the epoch's step calls from `context.step` on, while `passes` gives the epoch steps; with
    `keep_states`, keeps the metrics' variables of each call's end in `context.metric_states`.

    The batch hooks bracket each call of `context.fusion.steps` steps, as
    Keras's bracket each call of `steps_per_execution`; a call that reaches the
    uneven last batch runs as two, one per batch shape (`steps_of_one_shape`),
    which the hooks do not see.
    """
    fixed = not context.fusion.auto
    begin = context.step  # the call's first step, as Keras counts it: S a call for a fixed steps_per_execution S
    while n := passes.call_steps(context.step, context.fusion.steps):
        first = context.step
        callbacks.on_train_batch_begin(begin)
        while context.step < first + n:
            part = context.plan.steps_of_one_shape(passes.step, first + n - context.step)
            start = time.perf_counter()
            ran = run_steps(part)
            seconds = time.perf_counter() - start
            context.step_seconds += seconds
            context.fusion.observe(ran, seconds)
            context.examples_seen += context.examples_in(ran, passes.step)
            context.step += ran
            passes.ran(ran, part)
            if ran < part:
                break
        ran = context.step - first
        if ran:
            # A fixed steps_per_execution names its calls as Keras's do (`_compat.batch_end_index`), even where a
            # call ran fewer (the epoch's or the data's end); sized calls name the step they ended on.
            last = _compat.batch_end_index(begin, max(ran, context.fusion.steps)) if fixed else begin + ran - 1
            logs = objective.results(keep_states=keep_states) if batch_logs or keep_states else None
            context.metric_states = objective.states if keep_states else None
            callbacks.on_train_batch_end(last, logs if batch_logs else None)
            context.run_deferred()
        begin += context.fusion.steps if fixed else ran
        if model.stop_training:
            break
    warns = passes.steps_per_epoch is not None or _compat.warns_when_unknown_size_ends()  # as the installed Keras
    if passes.cut_short(context.step) and warns:
        warnings.warn(RAN_OUT, stacklevel=user_stacklevel())


