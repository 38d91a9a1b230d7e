"""Keras masks on tensors.
"""

from __future__ import annotations

from typing import Any


try:  # keras/src/backend/common/masking.py (3.5+); older Keras sets `_keras_mask` itself
    from keras.src.backend import get_keras_mask, set_keras_mask
except ImportError:  # pragma: no cover
    def get_keras_mask(x: Any) -> Any:
        return getattr(x, "_keras_mask", None)

    def set_keras_mask(x: Any, mask: Any) -> None:
        try:
            x._keras_mask = mask
        except AttributeError:
            pass
