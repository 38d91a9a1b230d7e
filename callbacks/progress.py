"""ProgressBar: one tqdm bar per epoch, drawn by the chief only."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from ._cluster import ContextAware

_PLAIN_LINES_PER_EPOCH = 4  # progress lines without a terminal, plus one summary


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _format(logs: dict[str, Any] | None, skip=("learning_rate",)) -> dict[str, str]:
    """Numbers to 4 significant digits: loss first, then metrics, then validation."""
    keys = sorted(logs or {}, key=lambda k: (k.startswith("val_"), k.removeprefix("val_") != "loss", k))
    return {k: f"{logs[k]:.4g}" for k in keys if k not in skip and isinstance(logs[k], (int, float))}


class ProgressBar(ContextAware):
    """Shows training progress: steps, examples/s and live metrics.

    In a terminal it is a tqdm bar per epoch; in Jupyter a notebook widget
    (`tqdm.auto`); with no terminal (logs, CI, captured output) a few plain
    lines per epoch. Validation metrics appear at the end of each epoch. Only
    the chief draws.

    Args:
      mode: "auto" (as above), "bar", "plain", or "epoch" (one line per epoch).
      file: where to write; sys.stdout by default.
    """

    def __init__(self, mode: str = "auto", file: TextIO | None = None):
        super().__init__()
        if mode not in ("auto", "bar", "plain", "epoch"):
            raise ValueError(
                f"`mode` must be 'auto', 'bar', 'plain' or 'epoch'. Received: mode={mode!r}. "
                "Pass 'auto' to pick a bar in terminals and notebooks and plain lines elsewhere."
            )
        if file is not None and not callable(getattr(file, "write", None)):
            raise TypeError(f"`file` must be a text stream with a write() method. Received: file={file!r}. "
                            "Pass e.g. file=sys.stderr, or None for stdout.")
        self.mode = mode
        self.file = file
        self._bar = None

    def _resolved_mode(self) -> str:
        if self.mode != "auto":
            return self.mode
        if _in_notebook():
            return "notebook"
        stream = self.file or sys.stdout
        return "bar" if getattr(stream, "isatty", lambda: False)() else "plain"

    def on_train_begin(self, logs=None):
        self._active = self.is_chief
        self._style = self._resolved_mode()
        self._total = self.params.get("steps")
        self._epochs = self.params.get("epochs")

    def on_epoch_begin(self, epoch, logs=None):
        if not self._active:
            return
        self._epoch, self._start, self._next_line = epoch, time.perf_counter(), 1
        self._first_step = self.epoch_step[1] if self.epoch_step else 0
        self._examples_at_start = self.context.examples_seen if self.context else 0
        if self._style in ("bar", "notebook"):
            if self._style == "notebook":
                from tqdm.auto import tqdm
            else:
                from tqdm import tqdm
            self._bar = tqdm(total=self._total, initial=self._first_step, desc=self._title(),
                             unit="step", file=self.file or sys.stdout, dynamic_ncols=True, leave=True)

    def _title(self) -> str:
        return f"Epoch {self._epoch + 1}/{self._epochs}"

    def _rate(self) -> str | None:
        if self.context is None:
            return None
        seconds = max(time.perf_counter() - self._start, 1e-9)
        return f"{(self.context.examples_seen - self._examples_at_start) / seconds:,.0f} ex/s"

    def on_train_batch_end(self, batch, logs=None):
        if not self._active:
            return
        done = batch + 1
        postfix = _format(logs)
        if (rate := self._rate()) is not None:
            postfix["speed"] = rate
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
            self._bar.set_postfix(postfix, refresh=False)
        elif self._style == "plain" and self._total:
            # Print when progress crosses the next quarter of the epoch.
            if done * _PLAIN_LINES_PER_EPOCH >= self._next_line * self._total and done < self._total:
                self._print(f"{self._title()}  {done}/{self._total}  "
                            + "  ".join(f"{k} {v}" for k, v in postfix.items()))
                self._next_line = done * _PLAIN_LINES_PER_EPOCH // self._total + 1

    def on_epoch_end(self, epoch, logs=None):
        if not self._active:
            return
        seconds = time.perf_counter() - self._start
        summary = _format(logs)
        if self._bar is not None:
            summary["time"] = f"{seconds:.1f}s"
            self._bar.set_postfix(summary, refresh=True)
            self._bar.close()
            self._bar = None
        else:
            rate = self._rate()
            self._print(f"{self._title()}  done in {seconds:.1f}s" + (f" ({rate})" if rate else "") + "  "
                        + "  ".join(f"{k} {v}" for k, v in summary.items()))

    def on_train_end(self, logs=None):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _print(self, line: str) -> None:
        print(line, file=self.file or sys.stdout, flush=True)
