"""Undoes the glibc setting that tf.data pins for the whole process, which halves CPU step speed.

This is the trainer's one process-wide patch, applied in one place: `Trainer.fit`, `evaluate` and `predict` call
`tune_process` first, unless `Trainer(tune_malloc=False)`, and the plan says which; the tasks that
`trainer-launch --serve` starts call `pin_then_raise`. A threshold the user set through glibc's environment
must be left alone. Why: docs/performance.md, "Two TensorFlow behaviours the figures depend on".
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD

_state = {"raised": False}
logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(None)
    libc.mallopt.restype, libc.mallopt.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
    return libc


def user_set_threshold() -> bool:
    """Whether the environment sets glibc's mmap threshold (then it is the user's to keep)."""
    return "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", "")


def raise_threshold() -> bool:
    """Raises glibc's mmap threshold to 32 MiB unless the user set it; returns whether it did.

    Two `mallopt` calls, microseconds: cheap next to a step call.
    """
    libc = _libc()
    if libc is None or user_set_threshold():
        return False
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    if not _state["raised"]:
        _state["raised"] = True
        logger.info("glibc's mmap threshold set to %d MiB: tf.data fixes it at 128 KiB (see trainer.engine.malloc)",
                    MMAP_THRESHOLD >> 20)
    return True


def raised() -> bool:
    """Whether `raise_threshold` has set the threshold in this process."""
    return _state["raised"]


def tune_process(enabled: bool) -> str:
    """Applies the patch once per process when `enabled`; returns the plan's line for it ("" where none applies)."""
    if _libc() is None:
        return ""
    if user_set_threshold():
        return "glibc's mmap threshold as the environment sets it"
    from trainer._compat.version import TF_DATA_PINS_MALLOC

    if not TF_DATA_PINS_MALLOC:
        return "glibc's malloc left as found: this TensorFlow's tf.data leaves its mmap threshold alone"
    if not enabled:
        return "left as found (Trainer(tune_malloc=False)); tf.data pins glibc's mmap threshold at 128 KiB"
    if not raised():
        pin_then_raise()
    return (f"glibc's mmap threshold raised to {MMAP_THRESHOLD >> 20} MiB for this process, over the 128 KiB "
            "that tf.data pins (Trainer(tune_malloc=False) leaves it)")


def pin_then_raise() -> bool:
    """Makes TensorFlow apply its once-per-process pin now, then raises the threshold; returns whether it did.

    Building one (empty) `Dataset.from_generator` kernel is what triggers
    TensorFlow's pin; later kernels leave the threshold as it is.
    """
    from trainer._compat.version import TF_DATA_PINS_MALLOC

    if _libc() is None or user_set_threshold() or not TF_DATA_PINS_MALLOC:
        return False
    import tensorflow as tf

    from trainer.quiet import startup_notices_hidden

    with startup_notices_hidden():  # TensorFlow's notice of its pin: the plan says what happens to it
        for _ in tf.data.Dataset.from_generator(lambda: iter(()), output_signature=tf.TensorSpec((), tf.int8)):
            pass
    return raise_threshold()
