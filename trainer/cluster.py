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


@dataclasses.dataclass(frozen=True)
class SlurmStep:
    """The Slurm job step (`srun`) this process is a task of, as Slurm's environment describes it."""

    task_id: int  # SLURM_PROCID: the task's rank in the step; task 0 is the chief
    num_tasks: int  # SLURM_STEP_NUM_TASKS
    nodes: str  # SLURM_STEP_NODELIST, Slurm's compressed host list, e.g. "gpu[01-04]"
    tasks_per_node: str  # SLURM_STEP_TASKS_PER_NODE, in the nodes' order, e.g. "4(x2),2"
    num_nodes: int
    job_id: int
    step_id: int
    distribution: str = ""  # SLURM_DISTRIBUTION when srun was given one

    def port_base(self) -> int:
        """The first port of this step's tasks on each node: `TRAINER_SLURM_PORT_BASE`, else one that every
        task computes alike from the job and step ids (so two jobs sharing a node rarely meet), in 12000-27999."""
        given = os.environ.get("TRAINER_SLURM_PORT_BASE")
        if given:
            return int(given)
        return 12000 + (self.job_id * 31 + self.step_id) % 1000 * 16

    def describe(self) -> str:
        """For the plan, e.g. "Slurm: 2 tasks on 1 node, chief task 0 (job 7, step 0)"."""
        tasks = f"{self.num_tasks} task{'s' if self.num_tasks != 1 else ''}"
        nodes = f"{self.num_nodes} node{'s' if self.num_nodes != 1 else ''}"
        return f"Slurm: {tasks} on {nodes}, chief task 0 (job {self.job_id}, step {self.step_id})"


def slurm_step(env: Mapping[str, str] | None = None) -> SlurmStep | None:
    """The job step this process runs in under `srun`, or None (not under Slurm, or an `sbatch` script's
    own process, which is one process however many tasks the job asked for)."""
    env = os.environ if env is None else env
    if "SLURM_PROCID" not in env or "SLURM_STEP_NUM_TASKS" not in env or "SLURM_STEP_NODELIST" not in env:
        return None
    try:
        return SlurmStep(task_id=int(env["SLURM_PROCID"]), num_tasks=int(env["SLURM_STEP_NUM_TASKS"]),
                         nodes=env["SLURM_STEP_NODELIST"],
                         tasks_per_node=env.get("SLURM_STEP_TASKS_PER_NODE", env["SLURM_STEP_NUM_TASKS"]),
                         num_nodes=int(env.get("SLURM_STEP_NUM_NODES", "1")),
                         job_id=int(env.get("SLURM_JOB_ID", "0")), step_id=int(env.get("SLURM_STEP_ID", "0") or 0),
                         distribution=env.get("SLURM_DISTRIBUTION", ""))
    except ValueError as err:
        raise ValueError(
            f"Slurm's environment must give this task's rank and the step's task count as integers ({err}). "
            f"Received: SLURM_PROCID={env.get('SLURM_PROCID')!r}, SLURM_STEP_NUM_TASKS="
            f"{env.get('SLURM_STEP_NUM_TASKS')!r}. Start the tasks with srun, or unset the SLURM_* variables "
            "to train in one process."
        ) from None


def slurm_addresses(step: SlurmStep, expand_hostlist, expand_tasks_per_node) -> list[str]:
    """Every task's `host:port`, in rank order, for Slurm's block distribution (its default): ranks fill
    the nodes in Slurm's node order, each node's tasks taking consecutive ports from `step.port_base()`.

    `expand_hostlist` and `expand_tasks_per_node` parse Slurm's compressed lists (TensorFlow's, from its
    SlurmClusterResolver, which itself orders the nodes by name: node10 before node9).
    """
    if step.distribution and not step.distribution.startswith("block"):
        raise ValueError(
            "Under Slurm the trainer places task ranks as Slurm's block distribution does (each node's tasks "
            f"consecutive). Received: SLURM_DISTRIBUTION={step.distribution!r}. Run srun with "
            "--distribution=block (or without --distribution), or set TF_CONFIG for each task yourself."
        )
    hosts, counts = expand_hostlist(step.nodes), expand_tasks_per_node(step.tasks_per_node)
    addresses = [f"{host}:{step.port_base() + local}" for host, count in zip(hosts, counts) for local in range(count)]
    if len(hosts) != len(counts) or len(addresses) != step.num_tasks:
        raise ValueError(
            f"Slurm's node list and tasks per node must add up to the step's {step.num_tasks} tasks. Received: "
            f"SLURM_STEP_NODELIST={step.nodes!r}, SLURM_STEP_TASKS_PER_NODE={step.tasks_per_node!r}. "
            "Start the tasks with srun inside the job's allocation, or set TF_CONFIG for each task."
        )
    return addresses


def cluster_info() -> ClusterInfo:
    """The `ClusterInfo` of this process: from TF_CONFIG when it is set, else from Slurm's environment
    under an `srun` of several tasks (task 0 is the chief), else one process."""
    raw = os.environ.get("TF_CONFIG")
    step = slurm_step() if not raw else None
    if step is not None and step.num_tasks > 1:
        return ClusterInfo(task_type="worker", task_id=step.task_id, num_workers=step.num_tasks)
    return parse_tf_config(raw)


def cluster_source() -> str:
    """Where this process's cluster came from, in words, for the plan ("" for one process)."""
    raw = os.environ.get("TF_CONFIG")
    if raw:
        info = parse_tf_config(raw)
        if info.task_type is None:
            return ""
        where = os.environ.get(LAUNCHER_MARK)
        origin = f"trainer-launch on {where}" if where else "TF_CONFIG"
        workers = info.num_workers - (1 if info.has_chief_task else 0)
        tasks = (["1 chief"] if info.has_chief_task else []) + [f"{workers} worker{'s' if workers != 1 else ''}"]
        tasks += [f"{info.num_ps} ps"] if info.num_ps else []
        return f"{origin}: {', '.join(tasks)}; chief: {'the chief task' if info.has_chief_task else 'worker 0'}"
    step = slurm_step()
    return step.describe() if step is not None and step.num_tasks > 1 else ""


LAUNCHER_MARK = "TRAINER_LAUNCH"  # set by trainer-launch in each task's environment: where the tasks run


def is_parameter_server(strategy) -> bool:
    """Whether `strategy` is parameter-server training (the one test for it, used everywhere)."""
    import tensorflow as tf  # here only: callbacks read TF_CONFIG through this module without TensorFlow

    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def strategy_cluster_info(strategy) -> ClusterInfo:
    """The cluster role of this process under `strategy` (single task unless multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if is_parameter_server(strategy):
        return cluster_info()  # its resolver is TF_CONFIG's, and the chief coordinates
    if resolver is None or not resolver.cluster_spec().as_dict():
        return ClusterInfo()
    spec = resolver.cluster_spec().as_dict()
    return parse_tf_config({"cluster": spec, "task": {"type": resolver.task_type, "index": resolver.task_id}})
