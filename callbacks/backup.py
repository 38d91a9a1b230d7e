"""BackupAndRestore: resume exactly after a crash, a kill or a preemption."""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import threading
import warnings
import zlib

import keras
import numpy as np

from trainer.data.marks import Mark, Reading
from trainer.distribute.cluster import BACKUP_DIR_ENV
from trainer.scaling import rescale_learning_rate, unscaled_learning_rate

from ._cluster import ContextAware, replace_or_explain, writable_dir
from ._paths import checked_frequency, checked_path
from ._preemption import SaveStep
from .checkpoint import weights_are_finite

BACKUP = "backup.npz"
MARK_PREFIX = "reader-"  # the input pipeline's place (trainer/data/marks.py), a file a mark, beside the backup


_launcher_fits = itertools.count(1)  # the fits of this process, in order: each backs up in a folder of its own


def launcher_backup(callbacks: list) -> list:
    """`callbacks`, with a BackupAndRestore in the folder trainer-launch gives (`TRAINER_BACKUP_DIR`, set
    with --max-restarts) when none of them backs up: so a restarted task resumes where the job stopped.

    Each fit of the process backs up in a folder of its own (fit-1, fit-2, ...): a script that trains twice
    and is restarted in its second fit runs the first again from the start, and resumes the second.
    """
    folder = os.environ.get(BACKUP_DIR_ENV)
    if not folder:
        return callbacks
    index = next(_launcher_fits)
    if any(getattr(c, "resumes", False) or isinstance(c, keras.callbacks.BackupAndRestore) for c in callbacks):
        return callbacks  # the script's own backup resumes it
    return [*callbacks, BackupAndRestore(os.path.join(folder, f"fit-{index}"))]


def _finite_loss(logs) -> bool:
    loss = (logs or {}).get("loss")
    return loss is None or math.isfinite(loss)


def _reading_record(reading: Reading | None, mark_file: str | None) -> dict | None:
    """The backup's record of where the reader is (`TrainContext.reading`), its mark's states in `mark_file`."""
    if reading is None:
        return None
    mark = reading.mark
    record = {"index": reading.index, "step": reading.step, "spent": reading.spent, "mark": None}
    if mark is not None:
        record["mark"] = {"index": mark.index, "step": mark.step, "inits_after": mark.inits_after,
                          "layout": mark.layout, "file": mark_file}
    return record


def _reading_of(record: dict | None, directory: str) -> Reading | None:
    """The `Reading` a backup holds (`_reading_record`), or None (written before readers were marked). A mark
    whose file is gone (deleted by hand) leaves the reading without it, and the resumed epoch reads on from
    its pass's start, as the plan's fallback says."""
    if record is None:
        return None
    mark = record["mark"]
    if mark is not None:
        path = os.path.join(directory, mark["file"])
        if not os.path.exists(path):
            warnings.warn(f"BackupAndRestore: {path}, the input pipeline's place that the backup names, is gone, so "
                          "the resumed epoch reads the pipeline from its pass's start, in another order than the "
                          "uninterrupted run.", stacklevel=2)
            return Reading(record["index"], record["step"], record["spent"])
        with np.load(path) as f:
            states = tuple(f[f"state_{i}"].tobytes() for i in range(len(f.files)))
        layout = tuple(mark["layout"]) if mark["layout"] is not None else None
        mark = Mark(mark["index"], mark["step"], states, mark["inits_after"], layout)
    return Reading(record["index"], record["step"], record["spent"], mark)


def _mark_file(mark: Mark) -> str:
    """The file of a mark's states, named by its place and contents: a mark is written once."""
    digest = 0
    for state in mark.states:
        digest = zlib.crc32(state, digest)
    return f"{MARK_PREFIX}{mark.index}-{mark.step}-{digest:08x}.npz"


class BackupAndRestore(ContextAware):
    """Backs up training state; re-running the same command resumes from the last backup.

    A backup holds the model's variables (random-generator states included),
    the optimizer's variables (step count, slots, learning rate) and the
    position: epoch and step within it. Array inputs are shuffled from (seed,
    epoch), so the position alone restores the data order, and a resumed run
    ends with the same weights as an uninterrupted one. Each backup replaces
    the previous one atomically, once every other callback had that step's or
    epoch's end hook: a crash in between never leaves a backup past an epoch
    whose log row or checkpoint is missing. On SIGTERM (a preemption notice) a backup is
    saved at the next step boundary and the process exits with status 143.
    Across workers, a SIGTERM to any of them makes every worker save the same
    step and exit: the first told names the next boundary (`_preemption.py`).
    When training completes, the backup is removed.

    Needs `Trainer.fit`, which resumes through its `TrainContext`; for a plain
    `Model.fit` use `keras.callbacks.BackupAndRestore`.

    A backup taken mid-epoch also holds the metrics' totals so far, so the
    resumed epoch logs its loss and metrics over all of its steps, as an
    uninterrupted run does. For a tf.data pipeline it also holds the
    reader's place (`trainer/data/marks.py`): the pipeline's state at its
    pass's start (or a stream's epoch's), in a `reader-*.npz` file beside the
    backup written once a pass, from which the resumed run reads on to the
    step, reshuffling pipelines included. Not exact: a generator or other
    state outside tf.data, which is read again from its start, a dataset
    function on another layout than its backup's, and parameter servers.

    Args:
      backup_dir: where the backup lives (shared by all workers).
      save_freq: "epoch", or a number of steps between backups (backups are
        also taken at the end of every epoch).
      handle_sigterm: install the SIGTERM handler.
    """

    resumes = True  # the plan says how exactly this fit can resume (plan.resume_note)

    def __init__(self, backup_dir: str | os.PathLike, save_freq: int | str = "epoch", handle_sigterm: bool = True):
        super().__init__()
        self.save_freq = checked_frequency(save_freq, arg="save_freq", example=500)
        self.backup_dir = checked_path(backup_dir, arg="backup_dir", owner="BackupAndRestore", is_dir=True)
        self.handle_sigterm = handle_sigterm
        self._preempted = False
        self._previous_handler = None
        self._save_step = None  # across workers: the boundary all of them save at on a SIGTERM
        self._boundary = 0  # batch ends and epoch ends so far in this fit
        self._mark_written: tuple[Mark, str] | None = None  # the latest mark a backup holds, and its file

    @property
    def path(self) -> str:
        return os.path.join(self.backup_dir, BACKUP)

    # Hooks -------------------------------------------------------------------

    def on_train_begin(self, logs=None):
        if self.context is None:
            raise ValueError(
                "`trainer.callbacks.BackupAndRestore` resumes through Trainer.fit and can't resume a plain "
                "Model.fit. Use it with Trainer.fit, or use keras.callbacks.BackupAndRestore."
            )
        self._preempted, self._boundary, self._mark_written = False, 0, None
        if self.handle_sigterm and threading.current_thread() is threading.main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)
            self.context.on_leave.append(self._restore_handler)  # also when fit raises
            self._save_step = SaveStep.for_context(self.context)
        if os.path.exists(self.path):
            state = self._restore()
            epoch, step = state["epoch"], state["step"]
            self.context.initial_epoch, self.context.initial_step = epoch, step
            if self.context.is_chief:
                print(f"BackupAndRestore: resuming from epoch {epoch}, step {step} ({self.path}"
                      f"{self._layout_change(state)}).", flush=True)
        self._saved_block = self.context.initial_step // self.save_freq if self.save_freq != "epoch" else 0

    def on_train_batch_end(self, batch, logs=None):
        epoch, step = self.context.epoch, self.context.step
        due = self.save_freq != "epoch" and step // self.save_freq > self._saved_block and _finite_loss(logs)
        if due:
            self._saved_block = step // self.save_freq
        self._boundary += 1
        stops = self._stops_here()
        if due or stops:
            self.context.defer(lambda: self._at_boundary(epoch, step, stops))

    def on_epoch_begin(self, epoch, logs=None):
        self._saved_block = self.context.step // self.save_freq if self.save_freq != "epoch" else 0

    def on_epoch_end(self, epoch, logs=None):
        if not _finite_loss(logs):  # stopped by NanGuard: the weights it restored are from mid-epoch
            return
        self._boundary += 1
        stops = self._stops_here()
        self.context.defer(lambda: self._at_boundary(epoch + 1, 0, stops))

    def on_train_end(self, logs=None):
        self._restore_handler()
        if not weights_are_finite(self.model) or not _finite_loss(logs):  # a NaN stop: keep the last good backup
            return
        if self.context.is_chief and os.path.exists(self.path):
            os.remove(self.path)
            self._remove_marks(self.backup_dir, keep={})

    # Machinery ---------------------------------------------------------------

    def _at_boundary(self, epoch: int, step: int, stops: bool) -> None:
        """Saves (and, for a SIGTERM, exits) once every callback had this boundary's hook: a backup then
        never holds a position past an epoch whose log row or checkpoint a crash kept from being written."""
        if stops:
            self._exit_preempted(epoch, step)
        else:
            self._save(epoch, step)

    def _layout_change(self, state: dict) -> str:
        """", written on 2 replica(s) over 1 worker(s)" when the backup came from another layout, else ""."""
        plan = self.context.plan
        if "replicas" not in state or (state["replicas"], state["workers"]) == (plan.num_replicas, plan.num_workers):
            return ""
        return f", written on {state['replicas']} replica(s) over {state['workers']} worker(s)"

    def _on_sigterm(self, signum, frame):
        self._preempted = True  # acted on at the next step boundary, where the state is consistent

    def _stops_here(self) -> bool:
        """Whether training stops at this boundary for a SIGTERM: this task's own, or, across workers, any
        worker's, at the boundary they agreed on (`_preemption.SaveStep`)."""
        agreement = self._save_step
        if agreement is None:
            return self._preempted
        if agreement.due(self._boundary):
            return True
        if self._preempted and agreement.target is None:
            return agreement.propose(self._boundary) is None  # a worker is gone: save here, as alone
        return False

    def _exit_preempted(self, epoch: int, step: int):
        self._save(epoch, step)
        self._restore_handler()
        if self.context.is_chief:
            told = "SIGTERM received" if self._preempted else "SIGTERM received by another worker"
            print(f"BackupAndRestore: {told}; backup saved at epoch {epoch}, step {step}. "
                  "Re-run the same command to resume.", flush=True)
        raise SystemExit(128 + signal.SIGTERM)

    def _restore_handler(self):
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None
        if self._save_step is not None:
            self._save_step.close()
            self._save_step = None

    def _save(self, epoch: int, step: int) -> None:
        if not weights_are_finite(self.model):
            print(f"BackupAndRestore: weights are not finite at epoch {epoch}, step {step}; "
                  "the previous backup is kept.", flush=True)
            return
        # The learning rate as the user tuned it: a run on another layout scales it for itself.
        with unscaled_learning_rate(self.model.optimizer, self.context.lr_plan):
            arrays = {f"model_{i}": np.asarray(v.numpy()) for i, v in enumerate(self.model.variables)}
            arrays.update({f"optimizer_{i}": np.asarray(v.numpy())
                           for i, v in enumerate(self.model.optimizer.variables)})
        metrics = self.context.metric_states if step else None  # an epoch's start resets them
        if metrics is not None:
            arrays.update({f"metrics_{i}": state for i, state in enumerate(metrics)})
        plan = self.context.plan
        state = {"epoch": epoch, "step": step, "model_vars": len(self.model.variables),
                 "metric_vars": None if metrics is None else len(metrics),
                 "optimizer_vars": len(self.model.optimizer.variables), "learning_rate": "unscaled",
                 "global_batch_size": plan.global_batch_size, "replicas": plan.num_replicas,
                 "workers": plan.num_workers}
        with writable_dir(self.backup_dir, self.context.is_chief) as directory:
            path = os.path.join(directory, BACKUP)
            try:
                state["reading"] = _reading_record(self.context.reading, self._write_mark(directory))
                arrays["state"] = np.asarray(json.dumps(state))
                replace_or_explain(lambda tmp: np.savez(tmp, **arrays), path, suffix=".npz",
                                   owner="BackupAndRestore", intact=lambda: self._intact(path))
            except OSError:
                self._restore_handler()  # fit ends here, without on_train_end
                raise
            self._remove_marks(directory, keep=(state["reading"] or {}).get("mark") or {})

    def _write_mark(self, directory: str) -> str | None:
        """The file of the reading's mark, written there the first time a backup holds the mark: once a pass, or
        once an epoch in a stream, however often the backups come. None without a mark."""
        reading = self.context.reading
        mark = reading.mark if reading is not None else None
        if mark is None:
            return None
        if self._mark_written is not None and self._mark_written[0] is mark:
            return self._mark_written[1]
        name = _mark_file(mark)
        if not self.context.is_chief:  # every worker's mark is the chief's (`DatasetKind.markable`)
            return name
        path = os.path.join(directory, name)
        states = {f"state_{i}": np.frombuffer(state, np.uint8) for i, state in enumerate(mark.states)}
        replace_or_explain(lambda tmp: np.savez(tmp, **states), path, suffix=".npz", owner="BackupAndRestore",
                           intact=lambda: self._intact(os.path.join(directory, BACKUP)))
        self._mark_written = (mark, name)
        return name

    @staticmethod
    def _remove_marks(directory: str, keep: dict) -> None:
        """Removes the files of marks that no backup holds any more (all of them, with `keep` empty)."""
        for name in os.listdir(directory):
            if name.startswith(MARK_PREFIX) and name != keep.get("file"):
                os.remove(os.path.join(directory, name))

    @staticmethod
    def _intact(path: str) -> str:
        if not os.path.exists(path):
            return "No earlier backup was written; fix the cause (free disk space, say) and train again."
        with np.load(path) as backup:
            state = json.loads(str(backup["state"]))
        return (f"The previous backup {path} (epoch {state['epoch']}, step {state['step']}) is intact; fix the "
                "cause (free disk space, say) and re-run the same command to resume from it.")

    def _restore(self) -> dict:
        """Puts the backup's values in the model and its optimizer; returns the backup's state (epoch, step, ...)."""
        with np.load(self.path) as backup:
            state = json.loads(str(backup["state"]))
            model_vars, optimizer_vars = self.model.variables, self.model.optimizer.variables
            if (state["model_vars"], state["optimizer_vars"]) != (len(model_vars), len(optimizer_vars)):
                raise ValueError(
                    f"The backup in {self.backup_dir!r} holds {state['model_vars']} model and "
                    f"{state['optimizer_vars']} optimizer variables, but this model has {len(model_vars)} and "
                    f"{len(optimizer_vars)}. Delete the backup directory or point `backup_dir` elsewhere."
                )
            self._check_layout(state)
            for prefix, variables in (("model", model_vars), ("optimizer", optimizer_vars)):
                for i, variable in enumerate(variables):
                    variable.assign(backup[f"{prefix}_{i}"])
            if state.get("metric_vars") is not None:
                self.context.initial_metric_states = [backup[f"metrics_{i}"] for i in range(state["metric_vars"])]
            self.context.initial_reading = _reading_of(state.get("reading"), self.backup_dir)
        if state.get("learning_rate") == "unscaled":
            rescale_learning_rate(self.model.optimizer, self.context.lr_plan)
        return state

    def _check_layout(self, state: dict) -> None:
        """Mid-epoch, the saved step counts global batches of the size the backup was written with."""
        saved, now = state.get("global_batch_size"), self.context.plan.global_batch_size
        if state["step"] == 0 or saved in (None, now):
            return
        raise ValueError(
            f"The backup in {self.backup_dir!r} stopped at epoch {state['epoch']}, step {state['step']} in global "
            f"batches of {saved} ({state['replicas']} replica(s) over {state['workers']} worker(s)), but this run's "
            f"global batch is {now} ({self.context.plan.num_replicas} replica(s)): the step would point elsewhere "
            f"in the epoch. Resume with the same global batch, Trainer(batch_size={saved}), on any layout; or "
            "delete the backup to start again."
        )
