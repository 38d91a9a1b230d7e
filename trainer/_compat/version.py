"""The Keras version, as (major, minor).
"""

from __future__ import annotations

import keras

def _keras_version() -> tuple[int, ...]:
    parts = []
    for part in keras.version().split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


KERAS_VERSION = _keras_version()  # (major, minor)


def debug_limits() -> tuple[int | None, int | None]:
    """Keras's debugging caps on every fit: `keras.config.set_max_epochs` and `set_max_steps_per_epoch`
    (keras/src/backend/config.py, 3.10-3.15; absent before, where nothing is capped)."""
    from keras.src.backend import config

    def read(name: str) -> int | None:
        getter = getattr(config, name, None)
        return getter() if getter is not None else None

    return read("max_epochs"), read("max_steps_per_epoch")


def batch_end_index(begin: int, steps: int) -> int:
    """The batch index Keras's loops give `on_*_batch_end` for a call of `steps` steps from `begin`: the call's
    last step from Keras 3.11 on (its epoch iterator yields `begin, end`), the step it began at before
    (keras/src/backend/tensorflow/trainer.py, 3.8-3.10: `on_train_batch_end(step, logs)`)."""
    return begin + steps - 1 if KERAS_VERSION >= (3, 11) else begin
