"""Keras masks on tensors.
"""

from __future__ import annotations

from typing import Any

from .patches import Patches

try:  # keras/src/backend/common/masking.py (3.8-3.16; re-exported by keras.src.backend before 3.16)
    from keras.src.backend import common as _common
    from keras.src.backend.common.masking import get_keras_mask as _get, set_keras_mask as _set
except ImportError:  # pragma: no cover - `_compat.platform` names it before a call
    _common = _get = _set = None

# Read, not replaced: listed so that `_compat.platform` checks that they are there before a call.
_TARGETS = Patches("Keras masks carried across the step's tf.function", [
    ("masking", _common, "masking", None, "keras/src/backend/common/masking.py")], {})


def get_keras_mask(x: Any) -> Any:
    return _get(x)


def set_keras_mask(x: Any, mask: Any) -> None:
    _set(x, mask)
