"""What a failed collective means, said as what to do: the peer that is gone, or a clash of group keys."""

from __future__ import annotations

import contextlib
import re
from typing import Any

import tensorflow as tf

from trainer.distribute.cluster import ClusterInfo


@contextlib.contextmanager
def explained_collective_errors(context: Any):
    """TensorFlow's errors for a dead peer or a collective-key clash, as errors that say what to do; `context` is
    the running fit's `context.TrainContext` (its epoch, step, strategy and cluster role)."""
    try:
        yield
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as err:
        raise RuntimeError(
            f"A collective failed in epoch {context.epoch} near step {context.step}: "
            f"{failed_peer(str(err), context.strategy, context.cluster)} is probably gone or stuck (see its log). "
            "With BackupAndRestore, re-run the job to resume. The per-collective timeout is "
            "resolve_strategy('multi_worker', timeout_seconds=...)."
        ) from err
    except tf.errors.InternalError as err:
        if "joining a group" not in str(err):
            raise
        raise RuntimeError(
            "Two MirroredStrategies over different devices used the same collective group key in this "
            "process (one ran outside the Trainer), and TensorFlow has aborted its collectives. Restart "
            "the process; then build strategies with resolve_strategy('mirrored', devices=[...]) (`from trainer "
            "import resolve_strategy`), or use one device layout per process."
        ) from err


_TASK_NAME = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


def failed_peer(message: str, strategy: tf.distribute.Strategy, own: ClusterInfo) -> str:
    """The peer task a collective's error names, with its address ("worker 1 (host:port)"), or "a peer task".

    TensorFlow names it as the remote end of a broken call ("remote target /job:worker/replica:0/task:1")
    or in its health check's abort ("cluster check alive failed, /job:worker/replica:0/task:1 is down").
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    for job, index in _TASK_NAME.findall(message):
        if (job, int(index)) == (own.task_type, own.task_id) or job not in spec:
            continue
        addresses = spec[job]
        address = addresses[int(index)] if isinstance(addresses, list) else addresses.get(int(index))
        return f"{job} {index} ({address})"
    return "a peer task"
