"""The key-value store of the coordination service that MultiWorkerMirroredStrategy starts.
"""

from __future__ import annotations

import tensorflow as tf

# The coordination service's key-value store: `context.context().{coordination_service,
# set_config_key_value, get_config_key_value}` (tensorflow/python/eager/context.py, 2.18-2.21, checked
# 2026-11-26). MultiWorkerMirroredStrategy starts the service, led by the chief, on every worker; TensorFlow's
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
