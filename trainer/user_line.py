"""The user's line: where the trainer's warnings point, however deep in the trainer and Keras they are raised."""

from __future__ import annotations

import os
import sys

import keras

# Where the trainer's and Keras's own frames live.
_INTERNAL = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                  for module in (sys.modules["trainer"], keras))


def user_stacklevel() -> int:
    """`warnings.warn`'s stacklevel that points at the user's call, from the function that warns: the first
    frame outside the trainer and Keras, however deep the model's own method made the way down."""
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    return level
