"""Undoes the glibc setting that tf.data pins for the whole process, which halves CPU step speed.

The first time a process builds a `GeneratorDataset` kernel, TensorFlow 2.21
calls `mallopt(M_MMAP_THRESHOLD, 128 KiB)` (`ApplyPython311MemoryPatch`, meant
for `Dataset.from_generator` on Python 3.11). Distributed iterators build one:
any MirroredStrategy iterator, and a OneDeviceStrategy iterator read inside a
`tf.function`, which is how the trainer reads datasets. From then on glibc
serves every allocation above 128 KiB with a fresh `mmap` and unmaps it on
free, so each step's activations and gradients are new pages to fault in:
1.1 million page faults per evaluation of 25,600 images instead of 29,000,
and the example's CNN trained 2.3x slower from a tf.data dataset than from
arrays on this project's 2-core CPU machine.

`unpin()` puts the threshold at 32 MiB, the ceiling glibc's own dynamic
threshold climbs to, with the trim threshold at twice that, as glibc pairs
them. It acts only when the threshold is pinned below 1 MiB and the user has
not set it through glibc's environment (`MALLOC_MMAP_THRESHOLD_` or
`GLIBC_TUNABLES`): setting either keeps the trainer's hands off.
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
_PROBE_BYTES = 1 << 20
_IS_MMAPPED = 0x2  # bit of a glibc chunk's size field

_state = {"unpinned": False}
logger = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    libc.mallopt.restype, libc.mallopt.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_int]
    return libc


def user_set_threshold() -> bool:
    """Whether the environment sets glibc's mmap threshold (then it is the user's to keep)."""
    return "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", "")


def threshold_pinned() -> bool:
    """Whether a freed 1 MiB block is mmap'ed again when asked for twice (glibc only).

    glibc's dynamic threshold rises to the size of a freed mmap'ed block, so
    the second request comes from the heap unless the threshold is fixed below it.
    """
    libc = _libc()
    if libc is None:
        return False
    libc.free(libc.malloc(_PROBE_BYTES))
    block = libc.malloc(_PROBE_BYTES)
    if not block:
        return False
    try:
        header = ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value
        return bool(header & _IS_MMAPPED)
    finally:
        libc.free(block)


def raised() -> bool:
    """Whether `unpin` has raised the threshold in this process."""
    return _state["unpinned"]


def unpin() -> bool:
    """Raises a threshold that tf.data pinned low; returns whether it did.

    Cheap after the first time it acts: TensorFlow pins the threshold once per
    process, so nothing is probed after that.
    """
    if _state["unpinned"] or user_set_threshold() or not threshold_pinned():
        return False
    libc = _libc()
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    _state["unpinned"] = True
    logger.info("tf.data had fixed glibc's mmap threshold at 128 KiB; raised it to %d MiB (see trainer.malloc)",
                MMAP_THRESHOLD >> 20)
    return True
