"""NanGuard: stop training at the first non-finite loss, saying where, with the last finite weights."""

from __future__ import annotations

import math
import sys
import time
import weakref

import numpy as np
import tensorflow as tf

from ._cluster import ContextAware
from trainer.engine.tracing import graph_function

AUTO_OVERHEAD = 0.02  # keep_every="auto": the copies take at most this share of training time


def _all_finite(arrays) -> bool:
    return all(np.isfinite(a).all() for a in arrays if np.issubdtype(a.dtype, np.floating))


class NanGuard(ContextAware):
    """Stops training when the loss becomes NaN or infinite, naming the epoch and step.

    On by default in `Trainer.fit` (`Trainer(nan_guard=False)` turns it off).
    Before step calls it keeps a host copy of the model's and optimizer's
    variables, if they are all finite; when the loss goes bad it puts the last
    such copy back, so the model (and any checkpoint saved afterwards) holds the
    last finite weights it copied, and says from which step they are. With
    several steps per call the step named is the last of the call in which the
    loss went bad. A copy is one device-to-host read of the variables; by
    default copies are skipped while they would take more than 2% of the
    training time, so with short calls the weights put back can be a few calls
    old.

    Args:
      keep_every: "auto" (the 2% budget), or copy before every N-th call
        (1: always the state before the call in which the loss went bad).

    Attributes:
      stopped_at: (epoch, step) where training was stopped, or None.
      restored_from: (epoch, step) whose weights were put back, or None.
    """

    def __init__(self, keep_every: int | str = "auto"):
        super().__init__()
        if keep_every != "auto" and (not isinstance(keep_every, int) or isinstance(keep_every, bool) or keep_every < 1):
            raise ValueError(f"`keep_every` must be 'auto' or a positive integer of calls. Received: "
                             f"keep_every={keep_every!r}. Pass 'auto', or 1 to copy before every call.")
        self.keep_every = keep_every
        self.stopped_at = None
        self.restored_from = None
        self._kept = None
        self._calls = 0
        self._copy_seconds = 0.0
        self._last_copy = -math.inf
        self._reader = None  # (the model, weakly; its variables' ids; the traced reader), for later fits

    def _read_all(self, variables: list) -> list:
        """The variables' values in one graph call: eager reads of distributed variables cost
        one dispatch each, which adds up for a model with an optimizer's slots."""
        key = tuple(id(v) for v in variables)
        if self._reader is None or self._reader[0]() is not self.model or self._reader[1] != key:
            self._reader = (weakref.ref(self.model), key,
                            graph_function(lambda: [tf.convert_to_tensor(v) for v in variables]))
        return self._reader[2]()

    def _variables(self):
        optimizer = getattr(self.model, "optimizer", None)
        return list(self.model.variables) + (list(optimizer.variables) if optimizer is not None else [])

    def _keep(self, where) -> None:
        values = [np.array(v) for v in self._read_all(self._variables())]
        if _all_finite(values):  # a finite loss can come with NaN weights (the last step's gradient)
            self._kept = (where, values)

    def on_train_begin(self, logs=None):
        self.stopped_at = self.restored_from = self._kept = None
        self._calls, self._last_copy = 0, -math.inf

    def on_train_batch_begin(self, batch, logs=None):
        # Before a call, after any resume: the state the call starts from.
        self._calls += 1
        if self.keep_every == "auto":
            # Copy only if the time since the last copy is at least 50x what a copy takes.
            due = time.perf_counter() - self._last_copy >= self._copy_seconds / AUTO_OVERHEAD
        else:
            due = (self._calls - 1) % self.keep_every == 0
        if due or self._kept is None:
            start = time.perf_counter()
            self._keep(self.epoch_step or (None, batch))
            self._last_copy = time.perf_counter()
            self._copy_seconds = self._last_copy - start

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(loss):
            return
        epoch, step = self.epoch_step or (None, batch + 1)
        self.stopped_at = (epoch, step)
        self.model.stop_training = True
        restored = self._restore()
        if self.is_chief:
            where = f"epoch {epoch}, step {step}" if epoch is not None else f"batch {batch}"
            print(
                f"NanGuard: the loss became {loss} by {where}; training stopped. {restored} Checkpoints keep the "
                "last finite weights. Lower the learning rate, check the inputs for NaN/Inf, or clip gradients "
                "(optimizer clipnorm=...).",
                file=sys.stderr,
                flush=True,
            )

    def _restore(self) -> str:
        if self._kept is None:
            return "No finite weights were seen to restore."
        (epoch, step), values = self._kept
        for variable, value in zip(self._variables(), values):
            variable.assign(value)
        self.restored_from = (epoch, step)
        self._kept = None  # the copy is in the model now; free the host memory
        at = f"epoch {epoch}, step {step}" if epoch is not None else f"{step} steps"
        return f"The model and optimizer hold the last finite weights again (after {at})."
