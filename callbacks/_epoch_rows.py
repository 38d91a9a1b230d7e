"""Shared by CSVLogger and JSONLogger: one row per epoch, written by the chief."""

from __future__ import annotations

import os
import time
from typing import Any

import keras

from ._cluster import ContextAware
from ._paths import checked_path


class EpochRowLogger(ContextAware):
    """Builds a row per epoch (epoch, metrics, LR, time, examples/s); subclasses store it.

    A resumed run continues the same file: rows of the epochs it re-runs are
    dropped before its first row is written, so no epoch appears twice.
    """

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self.path = checked_path(path, arg="path", owner=type(self).__name__, is_dir=False)
        self._resumed_rows_dropped = False

    def on_train_begin(self, logs=None):
        self._resumed_rows_dropped = False

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._examples_at_start = self.context.examples_seen if self.context else None

    def on_epoch_end(self, epoch, logs=None):
        if not self.is_chief:
            return
        seconds = time.perf_counter() - self._start
        row: dict[str, Any] = {"epoch": epoch, **(logs or {})}
        row.setdefault("learning_rate", self._learning_rate())
        row["epoch_time"] = seconds
        if self._examples_at_start is not None:
            row["examples_per_second"] = (self.context.examples_seen - self._examples_at_start) / max(seconds, 1e-9)
        if not self._resumed_rows_dropped:
            self.keep_rows_before(epoch)
            self._resumed_rows_dropped = True
        self.write_row(row)

    def _learning_rate(self) -> float | None:
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is None:
            return None
        return float(keras.ops.convert_to_numpy(optimizer.learning_rate))

    def keep_rows_before(self, epoch: int) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def write_row(self, row: dict[str, Any]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError
