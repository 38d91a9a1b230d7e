"""Training curves: loss and metrics, train and validation, to a PNG."""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

from ._cluster import ContextAware, replace_atomically
from ._paths import checked_path

_NOT_CURVES = ("learning_rate", "epoch_time", "examples_per_second")


def _require_matplotlib():
    try:  # pyplot picks Agg without a display, and the inline backend in notebooks
        import matplotlib.pyplot as plt
    except ImportError as err:  # matplotlib is an optional extra
        raise ImportError("Plotting needs matplotlib: pip install matplotlib.") from err
    return plt


def plot_history(history: Any, path: str | os.PathLike | None = None):
    """Draws one panel per metric (train and validation curves); returns the Figure.

    Args:
      history: a `keras.callbacks.History` or its `.history` dict.
      path: if given, the PNG is written there (atomically).
    """
    logs: Mapping[str, list] = getattr(history, "history", history)
    epochs_done = getattr(history, "epoch", None)
    names = sorted({k.removeprefix("val_") for k in logs} - set(_NOT_CURVES), key=lambda k: (k != "loss", k))
    if not names:
        raise ValueError(f"`history` has no metrics to plot. Received keys: {sorted(logs)}.")
    plt = _require_matplotlib()
    cols = min(3, len(names))
    rows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for key, label in ((name, "train"), (f"val_{name}", "validation")):
            if key in logs:
                values = logs[key]
                xs = ([e + 1 for e in epochs_done] if epochs_done and len(epochs_done) == len(values)
                      else range(1, len(values) + 1))
                ax.plot(list(xs), values, marker="o", markersize=3, label=label)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend()
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.tight_layout()
    if path is not None:
        replace_atomically(lambda tmp: fig.savefig(tmp, format="png", dpi=100), os.fspath(path), suffix=".png")
    return fig


class PlotHistory(ContextAware):
    """Redraws the training curves to a PNG at the end of every epoch (chief only).

    Args:
      path: the PNG file.
    """

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self.path = checked_path(path, arg="path", owner="PlotHistory", is_dir=False)
        self._logs: dict[str, list] = {}

    def on_train_begin(self, logs=None):
        self._logs = {}

    def on_epoch_end(self, epoch, logs=None):
        for key, value in (logs or {}).items():
            self._logs.setdefault(key, []).append(value)
        if self.is_chief:
            import matplotlib.pyplot as plt

            plt.close(plot_history(self._logs, self.path))
