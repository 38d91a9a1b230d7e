"""The task's place in the cluster, from TF_CONFIG, Slurm's environment or a strategy's resolver.

The cluster is described by TF_CONFIG, as Kubernetes (TFJob), Vertex AI and
`trainer-launch` set it, or, without TF_CONFIG, by the environment Slurm gives
each task of a job step (`srun`). Reading either is pure Python, testable
without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from trainer.distribute.slurm import slurm_step


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """This task's place in the cluster, as TF_CONFIG describes it."""

    task_type: str | None = None
    task_id: int = 0
    num_workers: int = 1  # tasks that compute: chief + workers (under parameter servers, the workers)
    num_ps: int = 0
    has_chief_task: bool = False  # False: worker 0 acts as the chief

    @property
    def is_chief(self) -> bool:
        """True for the task that owns side effects (plan, logs, checkpoints)."""
        if self.task_type in (None, "chief"):
            return True
        # With no dedicated chief, worker 0 plays the chief (TF's convention).
        return self.task_type == "worker" and self.task_id == 0 and not self.has_chief_task

    @property
    def rank(self) -> int:
        """This task's place among the tasks that compute, as TensorFlow numbers them (the chief first, then the
        workers): its replicas are those from `rank` times the replicas of a task on."""
        return self.task_id + (1 if self.task_type == "worker" and self.has_chief_task else 0)


def parse_tf_config(raw: str | Mapping[str, Any] | None) -> ClusterInfo:
    """Parses a TF_CONFIG value (JSON text or dict) into a `ClusterInfo`.

    Raises:
      ValueError: for text that is not JSON, or a cluster and task that don't fit
        together, naming TF_CONFIG, its value and the fix.
    """
    if not raw:
        return ClusterInfo()
    config = _load(raw)
    cluster = config.get("cluster") or {}
    task = config.get("task") or {}
    if not isinstance(cluster, dict) or not all(isinstance(v, (list, dict)) for v in cluster.values()):
        _bad(raw, "its 'cluster' must map task types to address lists, e.g. {\"worker\": [\"host:port\", ...]}")
    if task and not cluster:
        _bad(raw, "it has a 'task' and no 'cluster'. Add the cluster: every task's address, by type")
    if cluster and not isinstance(task, dict):
        _bad(raw, "its 'task' must be {\"type\": ..., \"index\": ...}")
    task_type, index = task.get("type"), task.get("index", 0)
    if task_type == "master" or "master" in cluster:
        _bad(raw, "it names a 'master' task, TensorFlow 1's name for the chief, which TensorFlow 2's strategies "
                  "do not know. Name it 'chief' (a TFJob's replica type Chief)")
    if task_type == EVALUATOR:  # outside the training cluster, as Kubeflow's TFJob sets it
        return ClusterInfo(task_type=EVALUATOR, task_id=int(index or 0), num_workers=max(1, _computing(cluster)),
                           num_ps=len(cluster.get("ps", [])), has_chief_task="chief" in cluster)
    if task_type is not None and task_type not in cluster:
        _bad(raw, f"its task type {task_type!r} is not in the cluster, which has {sorted(cluster)}. "
                  "Set task.type to one of those")
    if task_type is not None and (not isinstance(index, int) or not 0 <= index < len(cluster[task_type])):
        _bad(raw, f"its task index {index!r} is out of range: the cluster has {len(cluster[task_type])} "
                  f"{task_type!r} task(s), indices 0..{len(cluster[task_type]) - 1}. Set task.index within it")
    if len(cluster.get("chief", [])) > 1:
        _bad(raw, "it has more than one 'chief'. Keep one chief and make the others workers")
    return ClusterInfo(
        task_type=task_type,
        task_id=int(index or 0),
        num_workers=max(1, _computing(cluster)),
        num_ps=len(cluster.get("ps", [])),
        has_chief_task=len(cluster.get("chief", [])) > 0,
    )


EVALUATOR = "evaluator"


def _computing(cluster: dict) -> int:
    """The tasks that compute: the chief and the workers."""
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def _load(raw: str | Mapping[str, Any]) -> dict:
    if not isinstance(raw, str):
        return dict(raw)
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as err:
        _bad(raw, f"it is not JSON ({err})")
    if not isinstance(config, dict):
        _bad(raw, "it must be a JSON object")
    return config


def _bad(raw: Any, why: str):
    text = raw if isinstance(raw, str) else json.dumps(raw)
    raise ValueError(
        f"`TF_CONFIG` must describe this task's place in a cluster, but {why}. Received: TF_CONFIG={text!r}. "
        'Set it like {"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", '
        '"index": 0}} (trainer-launch does this), or unset it to train on one machine.'
    )


def cluster_info() -> ClusterInfo:
    """The `ClusterInfo` of this process: from TF_CONFIG when it is set, else from Slurm's environment
    under an `srun` of several tasks (task 0 is the chief), else one process."""
    raw = os.environ.get("TF_CONFIG")
    step = slurm_step() if not raw else None
    if step is not None and step.num_tasks > 1:
        return ClusterInfo(task_type="worker", task_id=step.task_id, num_workers=step.num_tasks)
    return parse_tf_config(raw)


def restarted() -> bool:
    """Whether trainer-launch started this task again (--max-restarts): the plan then says so, on one task too."""
    return ", restart " in os.environ.get(LAUNCHER_MARK, "")


def cluster_source() -> str:
    """Where this process's cluster came from, in words, for the plan ("" for one process)."""
    raw = os.environ.get("TF_CONFIG")
    if raw:
        info = parse_tf_config(raw)
        if info.task_type is None:
            return ""
        origin = os.environ.get(LAUNCHER_MARK) or "TF_CONFIG"
        workers = info.num_workers - (1 if info.has_chief_task else 0)
        tasks = (["1 chief"] if info.has_chief_task else []) + [f"{workers} worker{'s' if workers != 1 else ''}"]
        tasks += [f"{info.num_ps} ps"] if info.num_ps else []
        return f"{origin}: {', '.join(tasks)}; chief: {'the chief task' if info.has_chief_task else 'worker 0'}"
    step = slurm_step()
    return step.describe() if step is not None and step.num_tasks > 1 else ""


LAUNCHER_MARK = "TRAINER_LAUNCH"  # set in each task's environment by what set its TF_CONFIG, for the plan
BACKUP_DIR_ENV = "TRAINER_BACKUP_DIR"  # trainer-launch --max-restarts: where fit backs up (callbacks.backup)


def is_parameter_server(strategy) -> bool:
    """Whether `strategy` is parameter-server training (the one test for it, used everywhere)."""
    import tensorflow as tf  # here only: callbacks read TF_CONFIG through this module without TensorFlow

    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def strategy_cluster_info(strategy) -> ClusterInfo:
    """The cluster role of this process under `strategy` (single task unless multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if is_parameter_server(strategy):
        # This process coordinates (the chief task of a TF_CONFIG cluster, or a process outside an in-process
        # cluster's spec); the workers of the strategy's own cluster run the steps, the same count either way.
        from trainer import _compat  # here only, as tensorflow above

        tasks = _compat.parameter_server_tasks(strategy)
        if tasks is None:  # pragma: no cover - TF_CONFIG's count: the chief coordinates
            info = cluster_info()
            return dataclasses.replace(info, num_workers=max(1, info.num_workers - 1))
        return ClusterInfo(task_type="chief", num_workers=max(1, tasks[0]), num_ps=tasks[1], has_chief_task=True)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return ClusterInfo()
    spec = resolver.cluster_spec().as_dict()
    return parse_tf_config({"cluster": spec, "task": {"type": resolver.task_type, "index": resolver.task_id}})
