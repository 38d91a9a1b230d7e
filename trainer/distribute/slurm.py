"""The tasks of a Slurm job step (`srun`), read from the environment Slurm gives each of them.

Pure Python: the host lists are parsed by functions passed in (TensorFlow's
own, through `trainer._compat`), so this module loads without TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Mapping

ListParser = Callable[[str], list]


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
            if not given.isdigit() or not 1024 <= int(given) <= 65535 - self.num_tasks:
                raise ValueError(
                    f"TRAINER_SLURM_PORT_BASE must be a port number from 1024 to {65535 - self.num_tasks}, the first "
                    f"of each node's tasks' ports. Received: TRAINER_SLURM_PORT_BASE={given!r}. Set it to a free "
                    "port, e.g. 23456, or unset it to derive one from the job and step ids.")
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


def slurm_addresses(step: SlurmStep, expand_hostlist: ListParser, expand_tasks_per_node: ListParser) -> list[str]:
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


def ps_cluster(addresses: list[str], ps: int) -> dict[str, list[str]]:
    """A parameter-server cluster over a step's tasks (in rank order): task 0 the chief, which runs the
    script; the last `ps` tasks the ps tasks; the others the workers."""
    if not 1 <= ps <= len(addresses) - 2:
        raise ValueError(
            f"`--ps` must leave a chief and at least one worker among the step's {len(addresses)} tasks. Received: "
            f"--ps {ps}. Start more tasks (srun -n {ps + 2} or more) or fewer ps tasks."
        )
    return {"chief": addresses[:1], "worker": addresses[1:len(addresses) - ps], "ps": addresses[len(addresses) - ps:]}


def task_of(rank: int, cluster: dict[str, list[str]]) -> tuple[str, int]:
    """The (task type, index) of the task with this rank in `ps_cluster`'s order."""
    for kind in ("chief", "worker", "ps"):
        if rank < len(cluster[kind]):
            return kind, rank
        rank -= len(cluster[kind])
    raise ValueError(f"rank {rank} is beyond the cluster's tasks")
