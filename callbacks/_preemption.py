"""One step boundary at which every worker saves, whichever of them was told to stop.

The first worker told names the next step boundary in the coordination service's key-value store; every worker
acknowledges it from a watcher thread, and the one that named it runs no further step until all have, so all
save the same step. A worker that does not acknowledge in time is taken as gone, and the others save where they
are. Why no worker can be past that boundary: docs/reliability.md, "Faults".
"""

from __future__ import annotations

import itertools
import threading
import time

import tensorflow as tf

from trainer import _compat

ACK_SECONDS = 3.0  # a live worker acknowledges within milliseconds; one silent this long is gone
POLL_SECONDS = 1.0  # how often the watcher thread looks whether it should stop watching

_fits = itertools.count(1)  # every worker runs the same script, so its fits come in the same order


class SaveStep:
    """The boundary the workers of one fit save at, once any of them is told to stop.

    Boundaries are counted from the start of the fit: every batch end and every epoch end. The workers
    see the same ones, since they agree on how many steps each call runs.

    Args:
      index: this task's index among the workers (the chief first).
      num_workers: the workers that train (chief included).
      fit: which fit of the script this is (1, 2, ...): each agrees under keys of its own.
    """

    def __init__(self, index: int, num_workers: int, fit: int):
        prefix = f"trainer/backup/fit-{fit}"
        self._key, self._ack = f"{prefix}/save-at", f"{prefix}/ack"
        self.index, self.num_workers = index, num_workers
        self.target: int | None = None  # the boundary every worker saves at, once named
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="trainer-save-step", daemon=True)
        self._watcher.start()

    @classmethod
    def for_context(cls, context) -> "SaveStep | None":
        """The agreement for this fit's workers; None for a single task, or where the cluster has no store."""
        cluster = context.cluster
        if cluster.num_workers < 2 or cluster.num_ps or not _compat.cluster_store_running():
            return None
        index = 0 if cluster.task_type == "chief" else cluster.task_id + int(cluster.has_chief_task)
        return cls(index, cluster.num_workers, next(_fits))

    def propose(self, boundary: int) -> int | None:
        """Names the boundary after `boundary` (or learns the one a peer named first) and waits until every
        worker knows it. Returns it; None when some worker did not acknowledge within ACK_SECONDS."""
        named, deadline = boundary + 1, time.monotonic() + ACK_SECONDS
        try:
            if not _compat.put_cluster_key(self._key, str(named)):
                value = _compat.cluster_key(self._key, ACK_SECONDS)  # a peer named one first
                if value is None:
                    return None
                named = int(value)
            for index in range(self.num_workers):
                if _compat.cluster_key(f"{self._ack}/{index}", max(0.0, deadline - time.monotonic())) is None:
                    return None
        except tf.errors.OpError:  # the store is gone with the chief: nobody is left to agree with
            return None
        self.target = named
        return named

    def due(self, boundary: int) -> bool:
        return self.target is not None and boundary >= self.target

    def close(self) -> None:
        self._stop.set()
        self._watcher.join(timeout=2 * POLL_SECONDS)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                named = _compat.cluster_key(self._key, POLL_SECONDS)
                if named is not None:
                    self.target = int(named)
                    _compat.put_cluster_key(f"{self._ack}/{self.index}", "1")
                    return
            except tf.errors.OpError:  # the store is gone: the job is ending
                return
