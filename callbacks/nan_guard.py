"""NanGuard: stop training at the first non-finite loss, saying where."""

from __future__ import annotations

import math
import sys

from callbacks._cluster import ContextAware


class NanGuard(ContextAware):
    """Stops training when the loss becomes NaN or infinite, naming the epoch and step.

    On by default in `Trainer.fit` (`Trainer(nan_guard=False)` turns it off).
    ModelCheckpoint and BackupAndRestore never save non-finite weights, so the
    last good checkpoint survives. With several steps per call the step named
    is the last of the call in which the loss went bad.

    Attributes:
      stopped_at: (epoch, step) where training was stopped, or None.
    """

    def __init__(self):
        super().__init__()
        self.stopped_at = None

    def on_train_begin(self, logs=None):
        self.stopped_at = None

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(loss):
            return
        epoch, step = self.epoch_step or (None, batch + 1)
        self.stopped_at = (epoch, step)
        self.model.stop_training = True
        if self.is_chief:
            where = f"epoch {epoch}, step {step}" if epoch is not None else f"batch {batch}"
            print(
                f"NanGuard: the loss became {loss} by {where}; training stopped. Checkpoints keep the last "
                "finite weights. Lower the learning rate, check the inputs for NaN/Inf, or clip gradients "
                "(optimizer clipnorm=...).",
                file=sys.stderr,
                flush=True,
            )
