"""JSONLogger: JSON Lines, one object per epoch, appended."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from ._cluster import replace_atomically
from ._epoch_rows import EpochRowLogger


class JSONLogger(EpochRowLogger):
    """Appends one JSON object per epoch (epoch, metrics, learning rate, time, examples/s).

    A resumed run goes on in the same file; rows for epochs it re-runs are
    dropped first, and so is a last line torn by a crash mid-append. Only the
    chief writes.

    Args:
      path: the .jsonl file.
    """

    def keep_rows_before(self, epoch: int) -> None:
        if not os.path.exists(self.path):
            return
        with open(self.path) as f:
            lines = [line for line in f if line.strip()]
        rows = [_parse(line, self.path, number, last=number == len(lines)) for number, line in enumerate(lines, 1)]
        kept = [r for r in rows if r is not None and r["epoch"] < epoch]
        if len(kept) != len(rows):
            replace_atomically(lambda tmp: _dump(tmp, kept), self.path, suffix=".jsonl")

    def write_row(self, row: dict[str, Any]) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=_listed) + "\n")


def _parse(line: str, path: str, number: int, last: bool) -> dict[str, Any] | None:
    """A row of the file; None for a last line that a crash cut short."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        if last and not line.endswith("\n"):
            return None
        raise ValueError(
            f"JSONLogger can't continue {path!r}: its line {number} is not JSON ({err}), and only a last line "
            "cut short by a crash is dropped. Received: " + repr(line[:80]) + ". Fix or remove that line, or "
            "log to a new file."
        ) from err


def _dump(path: str, rows: list[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(r, default=_listed) + "\n" for r in rows)


def _listed(value: Any) -> Any:
    """A NumPy value in the logs (a metric's per-class array) as JSON: a list, or a number."""
    return np.asarray(value).tolist()
