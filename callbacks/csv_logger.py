"""CSVLogger: one row per epoch, continued across resumed runs."""

from __future__ import annotations

import csv
import os
from typing import Any

from ._cluster import replace_atomically
from ._epoch_rows import EpochRowLogger


class CSVLogger(EpochRowLogger):
    """Writes epoch, every metric, the learning rate, epoch time and examples/s to a CSV file.

    The file is rewritten atomically each epoch (it holds one row per epoch),
    so a crash never leaves a torn row and new columns (say, validation
    metrics that start later) get a header. Only the chief writes.

    Args:
      path: the CSV file.
    """

    def _read(self) -> tuple[list[str], list[dict[str, str]]]:
        if not os.path.exists(self.path):
            return [], []
        with open(self.path, newline="") as f:
            reader = csv.DictReader(f)
            return list(reader.fieldnames or []), list(reader)

    def _write(self, fields: list[str], rows: list[dict[str, Any]]) -> None:
        def write(tmp):
            with open(tmp, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fields, restval="")
                writer.writeheader()
                writer.writerows(rows)

        replace_atomically(write, self.path, suffix=".csv")

    def keep_rows_before(self, epoch: int) -> None:
        fields, rows = self._read()
        if rows:
            self._write(fields, [r for r in rows if int(r["epoch"]) < epoch])

    def write_row(self, row: dict[str, Any]) -> None:
        fields, rows = self._read()
        fields = fields + [k for k in row if k not in fields]
        self._write(fields, rows + [row])
