"""The coordination service that MultiWorkerMirroredStrategy starts: its key-value store, and its SIGTERM handler.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

import tensorflow as tf

# The coordination service's key-value store: `context.context().{coordination_service,
# set_config_key_value, get_config_key_value}` (tensorflow/python/eager/context.py, 2.18-2.22).
# MultiWorkerMirroredStrategy starts the service, led by the chief, on every worker; TensorFlow's
# PreemptionCheckpointHandler agrees on its save step through it, as BackupAndRestore does (callbacks/_preemption.py).


def cluster_store_running() -> bool:
    """Whether this process belongs to a cluster whose coordination service holds a key-value store."""
    from tensorflow.python.eager import context

    return getattr(context.context(), "coordination_service", None) is not None


def put_cluster_key(key: str, value: str) -> bool:
    """Sets `key` in the cluster's store; False if it was set already (by any task): keys are set once."""
    from tensorflow.python.eager import context

    try:
        context.context().set_config_key_value(key, value)
    except tf.errors.AlreadyExistsError:
        return False
    return True


def cluster_key(key: str, timeout_seconds: float) -> str | None:
    """`key`'s value in the cluster's store, waiting up to `timeout_seconds` for a task to set it; else None."""
    from tensorflow.python.eager import context

    try:
        return context.context().get_config_key_value(key, max(1, int(timeout_seconds * 1000)))
    except tf.errors.DeadlineExceededError:
        return None


@contextlib.contextmanager
def sigterm_kept() -> Iterator[None]:
    """Puts back, after the block, the SIGTERM handler Python had before it (on the main thread).

    The coordination service that MultiWorkerMirroredStrategy starts installs a C++ SIGTERM handler of its
    own, TensorFlow's preemption notifier (`preemption_notifier.cc`, 2.18-2.22), which
    only records the signal for TensorFlow's PreemptionCheckpointHandler. Python's `signal.getsignal` still
    says SIG_DFL, but the process lives on after a SIGTERM: a launcher's or Slurm's stop of a task that has
    not begun training (building the model, say) waits out its grace period (10 s, or Slurm's 30 s) before
    its SIGKILL. The trainer saves on SIGTERM itself (BackupAndRestore), so it puts Python's handler back: a
    SIGTERM again ends the task (status 143), or reaches the user's own handler. Not while the strategy is
    made: a task waiting there for a peer that died holds Python's lock in TensorFlow's C++ until the
    cluster forms, so nothing can put the handler back before that (measured: a watcher thread never ran).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if before is not None:  # None: a handler Python did not install, which is not Python's to put back
            signal.signal(signal.SIGTERM, before)
