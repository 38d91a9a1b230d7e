"""The task's place in the cluster, from TF_CONFIG or from a strategy's resolver.

The cluster is described by TF_CONFIG, as Kubernetes (TFJob), Vertex AI and
`trainer-launch` set it. Parsing it is pure Python, testable without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """This task's place in the cluster, as TF_CONFIG describes it."""

    task_type: str | None = None
    task_id: int = 0
    num_workers: int = 1  # tasks that compute: chief + workers
    num_ps: int = 0
    has_chief_task: bool = False  # False: worker 0 acts as the chief

    @property
    def is_chief(self) -> bool:
        """True for the task that owns side effects (plan, logs, checkpoints)."""
        if self.task_type in (None, "chief"):
            return True
        # With no dedicated chief, worker 0 plays the chief (TF's convention).
        return self.task_type == "worker" and self.task_id == 0 and not self.has_chief_task


def parse_tf_config(raw: str | Mapping[str, Any] | None) -> ClusterInfo:
    """Parses a TF_CONFIG value (JSON text or dict) into a `ClusterInfo`."""
    if not raw:
        return ClusterInfo()
    config = json.loads(raw) if isinstance(raw, str) else dict(raw)
    cluster = config.get("cluster", {}) or {}
    task = config.get("task", {}) or {}
    n_chief = len(cluster.get("chief", []))
    n_workers = len(cluster.get("worker", []))
    return ClusterInfo(
        task_type=task.get("type"),
        task_id=int(task.get("index", 0)),
        num_workers=max(1, n_chief + n_workers),
        num_ps=len(cluster.get("ps", [])),
        has_chief_task=n_chief > 0,
    )


def cluster_info() -> ClusterInfo:
    """The `ClusterInfo` of this process, from the TF_CONFIG environment variable."""
    return parse_tf_config(os.environ.get("TF_CONFIG"))


def strategy_cluster_info(strategy) -> ClusterInfo:
    """The cluster role of this process under `strategy` (single task unless multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if type(strategy).__name__.startswith("ParameterServerStrategy"):
        return cluster_info()  # its resolver is TF_CONFIG's, and the chief coordinates
    if resolver is None or not resolver.cluster_spec().as_dict():
        return ClusterInfo()
    spec = resolver.cluster_spec().as_dict()
    return parse_tf_config({"cluster": spec, "task": {"type": resolver.task_type, "index": resolver.task_id}})
