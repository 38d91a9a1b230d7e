"""ModelCheckpoint: the best k and the last, each written atomically by the chief."""

from __future__ import annotations

import json
import math
import os
import warnings
from typing import Any

import numpy as np

# trainer.scaling also registers ScaledSchedule, which checkpoints may contain.
from trainer.scaling import unscaled_learning_rate
from ._cluster import ContextAware, replace_or_explain, writable_dir
from ._paths import checked_path

INDEX = "checkpoints.json"


def weights_are_finite(model) -> bool:
    """True when every weight of `model` is finite (NaN/Inf weights are never saved)."""
    return all(np.all(np.isfinite(w)) for w in model.get_weights() if np.issubdtype(w.dtype, np.floating))


class ModelCheckpoint(ContextAware):
    """Saves checkpoints at the end of each epoch: the best `keep` ones and the last.

    Files are `epochNNN.keras` (whole model, optimizer included) or
    `epochNNN.weights.h5` with `save_weights_only`, plus `last.*` and an index,
    `checkpoints.json`, that names them with their scores. Each file is written
    to a temporary name and renamed, so a crash mid-write leaves the previous
    checkpoint intact. Weights that are not finite are never saved. A checkpoint
    saved under any strategy loads into a model built without one:
    `keras.models.load_model(path)` or `model.load_weights(path)`. Its
    learning rate is the one the model was compiled with, before the trainer
    scaled it for the replica count, so a fit of the loaded model on any layout
    scales it once, as for the original.

    Under multi-worker training every worker saves (in step), but only the
    chief's files remain; the others write to temporary directories.

    Args:
      directory: where the checkpoints go.
      monitor: the log key that ranks checkpoints, e.g. "val_loss".
      mode: "min", "max" or "auto" (max for accuracy-like names).
      save_best_only: keep the best `keep` epochs; otherwise the `keep` most recent.
      save_last: also keep `last.*`, overwritten every epoch.
      keep: how many ranked (or recent) checkpoints to keep.
      save_weights_only: save `.weights.h5` files instead of whole `.keras` models.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        monitor: str = "val_loss",
        mode: str = "auto",
        save_best_only: bool = False,
        save_last: bool = True,
        keep: int = 1,
        save_weights_only: bool = False,
    ):
        super().__init__()
        if not isinstance(monitor, str):
            raise TypeError(f"`monitor` must be a log key (str). Received: monitor={monitor!r}. "
                            "Pass e.g. monitor='val_loss'.")
        if mode not in ("auto", "min", "max"):
            raise ValueError(f"`mode` must be 'auto', 'min' or 'max'. Received: mode={mode!r}. Pass 'min' for "
                             "losses, 'max' for accuracies, or 'auto' to tell from `monitor`.")
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"`keep` must be an integer >= 1. Received: keep={keep!r}. "
                             "Pass how many checkpoints to keep, e.g. keep=3.")
        self.directory = checked_path(directory, arg="directory", owner="ModelCheckpoint", is_dir=True)
        self.monitor = monitor
        if mode == "auto":
            mode = "max" if any(s in monitor for s in ("acc", "auc", "precision", "recall")) else "min"
        self.mode = mode
        self.save_best_only = save_best_only
        self.save_last = save_last
        self.keep = keep
        self.save_weights_only = save_weights_only
        self.kept: list[dict[str, Any]] = []  # newest last; each {"file", "epoch", "value"}
        self._first_epoch = True

    @property
    def suffix(self) -> str:
        return ".weights.h5" if self.save_weights_only else ".keras"

    @staticmethod
    def read_index(directory: str | os.PathLike) -> dict[str, Any]:
        """The index of a checkpoint directory: {"monitor", "mode", "kept": [...], "last": ...}."""
        with open(os.path.join(directory, INDEX)) as f:
            return json.load(f)

    @classmethod
    def best_path(cls, directory: str | os.PathLike) -> str:
        """Path of the best checkpoint in `directory` (the newest when not ranking)."""
        index = cls.read_index(directory)
        return os.path.join(directory, index["best"])

    @classmethod
    def last_path(cls, directory: str | os.PathLike) -> str:
        """Path of the last checkpoint in `directory`."""
        return os.path.join(directory, cls.read_index(directory)["last"]["file"])

    def on_train_begin(self, logs=None):
        self.kept, self._first_epoch = [], True

    def _continue_index(self, epoch: int) -> None:
        """A run that resumes at `epoch` keeps ranking the checkpoints of the epochs before it."""
        if self.is_chief and os.path.exists(os.path.join(self.directory, INDEX)):
            self.kept = [k for k in self.read_index(self.directory)["kept"]
                         if k["epoch"] < epoch and os.path.exists(os.path.join(self.directory, k["file"]))]

    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def on_epoch_end(self, epoch, logs=None):
        if self._first_epoch:  # only now is it known where this run started
            self._continue_index(epoch)
            self._first_epoch = False
        logs = logs or {}
        value = logs.get(self.monitor)
        if not weights_are_finite(self.model):
            warnings.warn(f"ModelCheckpoint: weights are not finite after epoch {epoch}; nothing saved, "
                          "earlier checkpoints are kept.")
            return
        if self.save_best_only and value is None:
            warnings.warn(f"ModelCheckpoint: `{self.monitor}` is not in the logs ({sorted(logs)}); "
                          "can't rank checkpoints, so nothing but `last` is saved.")
        value = None if value is None or not math.isfinite(value) else float(value)
        entry = {"file": f"epoch{epoch + 1:03d}{self.suffix}", "epoch": epoch, "value": value}
        with writable_dir(self.directory, self.is_chief) as directory:
            evicted = []
            if self._should_keep(entry):
                self._save(os.path.join(directory, entry["file"]))
                self.kept.append(entry)
                evicted = self._evict()
            if self.save_last:
                self._save(os.path.join(directory, f"last{self.suffix}"))
            self._write_index(directory, epoch)
            # Only once the index no longer names them: a crash before this leaves extra files, not a dangling index.
            for gone in evicted:
                _remove(os.path.join(directory, gone["file"]))

    def _should_keep(self, entry: dict[str, Any]) -> bool:
        if not self.save_best_only:
            return True
        if entry["value"] is None:
            return False
        ranked = [k for k in self.kept if k["value"] is not None]
        return len(ranked) < self.keep or any(self._better(entry["value"], k["value"]) for k in ranked)

    def _evict(self) -> list[dict[str, Any]]:
        if len(self.kept) <= self.keep:
            return []
        if self.save_best_only:
            worst = sorted(self.kept, key=lambda k: k["value"], reverse=self.mode == "min")[0]
            evicted = [worst]
        else:
            evicted = self.kept[: len(self.kept) - self.keep]
        gone = {k["file"] for k in evicted}
        self.kept = [k for k in self.kept if k["file"] not in gone]
        return evicted

    def _save(self, path: str) -> None:
        save = self.model.save_weights if self.save_weights_only else self.model.save
        lr_plan = self.context.lr_plan if self.context is not None else None  # None: no trainer scaled it
        # The LR as tuned, which the next fit scales for its layout.
        with unscaled_learning_rate(getattr(self.model, "optimizer", None), lr_plan):
            replace_or_explain(lambda tmp: save(tmp), path, suffix=self.suffix, owner="ModelCheckpoint",
                               intact=lambda: self._intact(path))

    def _intact(self, path: str) -> str:
        """What a failed write of `path` leaves: the file it would replace, else the newest checkpoint."""
        directory = os.path.dirname(path)
        candidates = [path, os.path.join(directory, f"last{self.suffix}")]
        candidates += [os.path.join(directory, k["file"]) for k in reversed(self.kept)]
        intact = next((c for c in candidates if os.path.exists(c)), None)
        if intact is None:
            return "No earlier checkpoint was written; fix the cause (free disk space, say) and train again."
        return f"The previous checkpoint {intact} is intact; fix the cause (free disk space, say) and resume."

    def _write_index(self, directory: str, epoch: int) -> None:
        ranked = [k for k in self.kept if k["value"] is not None]
        if self.save_best_only and ranked:
            best = sorted(ranked, key=lambda k: k["value"], reverse=self.mode == "max")[0]["file"]
        else:
            best = self.kept[-1]["file"] if self.kept else f"last{self.suffix}"
        index = {"monitor": self.monitor, "mode": self.mode, "kept": self.kept, "best": best,
                 "last": {"file": f"last{self.suffix}", "epoch": epoch} if self.save_last else None}

        def write(tmp):
            with open(tmp, "w") as f:
                json.dump(index, f, indent=1)

        index_path = os.path.join(directory, INDEX)
        replace_or_explain(write, index_path, suffix=".json", owner="ModelCheckpoint",
                           intact=lambda: f"The previous index {index_path} is intact." if os.path.exists(index_path)
                           else "No index was written before.")


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)
