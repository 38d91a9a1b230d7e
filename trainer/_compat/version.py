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
