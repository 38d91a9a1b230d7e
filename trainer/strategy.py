"""Strategy names -> `tf.distribute.Strategy` instances, and the task's cluster role.

The cluster is described by TF_CONFIG, as Kubernetes (TFJob), Vertex AI and
`trainer-launch` set it. Parsing TF_CONFIG is pure Python so it can be tested
without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import tensorflow as tf

STRATEGY_NAMES = (
    "auto",
    "default",
    "one_device",
    "mirrored",
    "central_storage",
    "multi_worker",
    "parameter_server",
    "tpu",
)

# Environment variables that say a TPU may be reachable. Without one of them,
# "auto" never asks TPUClusterResolver, which would otherwise probe the GCE
# metadata server and can block for a long time off Google Cloud.
_TPU_HINTS = ("TPU_NAME", "TPU_WORKER_ID", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE")


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


def auto_strategy_name(info: ClusterInfo, num_gpus: int, tpu_hinted: bool) -> str:
    """The name "auto" resolves to: TPU, then cluster, then GPUs, then one device."""
    if tpu_hinted:
        return "tpu"
    if info.num_ps > 0:
        return "parameter_server"
    if info.num_workers > 1:
        return "multi_worker"
    if num_gpus > 1:
        return "mirrored"
    return "one_device"


def resolve_strategy(strategy: str | tf.distribute.Strategy | None) -> tf.distribute.Strategy:
    """Returns a strategy instance for a name or an instance.

    Args:
      strategy: a `tf.distribute.Strategy`, None (the current strategy), or one of
        `STRATEGY_NAMES`.

    Raises:
      ValueError: for an unknown name, or "tpu" when no TPU can be reached.
    """
    if isinstance(strategy, tf.distribute.Strategy):
        return strategy
    if strategy is None:
        return tf.distribute.get_strategy()
    check_strategy_name(strategy)
    name = strategy
    if name == "auto":
        tpu_hinted = any(os.environ.get(k) for k in _TPU_HINTS)
        gpus = tf.config.list_logical_devices("GPU")
        name = auto_strategy_name(cluster_info(), len(gpus), tpu_hinted)
    return _BUILDERS[name]()


def check_strategy_name(strategy: Any) -> None:
    """Raises a clear error unless `strategy` is a known name or an instance."""
    if isinstance(strategy, tf.distribute.Strategy) or strategy is None:
        return
    if not isinstance(strategy, str):
        raise TypeError(
            "`strategy` must be a tf.distribute.Strategy or a name. "
            f"Received: strategy={strategy!r} of type {type(strategy).__name__}. "
            f"Pass one of {', '.join(STRATEGY_NAMES)}."
        )
    if strategy not in STRATEGY_NAMES:
        raise ValueError(
            f"Unknown `strategy` name. Received: strategy={strategy!r}. "
            f"Pass one of {', '.join(STRATEGY_NAMES)}, or a tf.distribute.Strategy instance."
        )


def _compute_devices() -> list[str]:
    """GPUs if any, else every logical CPU (so CPU-only machines can simulate replicas)."""
    gpus = tf.config.list_logical_devices("GPU")
    return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]


def _one_device() -> tf.distribute.Strategy:
    return tf.distribute.OneDeviceStrategy(_compute_devices()[0])


def _mirrored() -> tf.distribute.Strategy:
    return tf.distribute.MirroredStrategy(devices=_compute_devices())


def _central_storage() -> tf.distribute.Strategy:
    return tf.distribute.experimental.CentralStorageStrategy(compute_devices=_compute_devices())


def _multi_worker() -> tf.distribute.Strategy:
    return tf.distribute.MultiWorkerMirroredStrategy()


def _parameter_server() -> tf.distribute.Strategy:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not resolver.cluster_spec().as_dict().get("ps"):
        raise ValueError(
            "`strategy='parameter_server'` needs a cluster with at least one 'ps' task. "
            f"Received: TF_CONFIG={os.environ.get('TF_CONFIG')!r}. "
            "Set TF_CONFIG (or use trainer-launch --ps 1) before creating the strategy."
        )
    return tf.distribute.ParameterServerStrategy(resolver)


def _tpu() -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise ValueError(
            "`strategy='tpu'` found no reachable TPU. Received: strategy='tpu'. "
            "Run on a TPU VM (or set TPU_NAME), or pick another strategy. "
            f"TensorFlow said: {err}"
        ) from err
    return tf.distribute.TPUStrategy(resolver)


_BUILDERS = {
    "default": tf.distribute.get_strategy,
    "one_device": _one_device,
    "mirrored": _mirrored,
    "central_storage": _central_storage,
    "multi_worker": _multi_worker,
    "parameter_server": _parameter_server,
    "tpu": _tpu,
}


def strategy_cluster_info(strategy: tf.distribute.Strategy) -> ClusterInfo:
    """The cluster role of this process under `strategy` (single task unless multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return ClusterInfo()
    spec = resolver.cluster_spec().as_dict()
    return parse_tf_config({"cluster": spec, "task": {"type": resolver.task_type, "index": resolver.task_id}})
