"""Which of a machine's GPUs each of its local workers computes on. Pure Python: no TensorFlow here.

TensorFlow takes the memory of every GPU it sees, so two workers on one machine that both see every GPU run
out of memory, or share devices. `trainer-launch` gives each local worker its own GPUs through
`CUDA_VISIBLE_DEVICES`, as torchrun and Accelerate give each local process its own device; under `srun`,
where Slurm bound no GPUs to the tasks, each task takes its share by its local id (`slurm_share`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Mapping, Sequence

VISIBLE = "CUDA_VISIBLE_DEVICES"
NONE = "-1"  # CUDA_VISIBLE_DEVICES that shows a process no GPU
PROC_GPUS = "/proc/driver/nvidia/gpus"  # one folder per GPU, where NVIDIA's driver is loaded


def machine_gpus(env: Mapping[str, str] | None = None) -> tuple[list[str], str]:
    """The GPUs this machine's processes may use, as CUDA_VISIBLE_DEVICES names them, and where that came from.

    A CUDA_VISIBLE_DEVICES already set (by the user, or by Slurm) is kept: its entries up to the first that
    names no device (CUDA ignores the rest). Else one GPU per line of `nvidia-smi -L` ("GPU 0: ..."), by
    index; else one per device folder of the driver's /proc/driver/nvidia/gpus; else none.
    """
    env = os.environ if env is None else env
    if VISIBLE in env:
        entries = []
        for entry in (e.strip() for e in env[VISIBLE].split(",")):
            if not entry or entry.startswith("-"):
                break
            entries.append(entry)
        return entries, f"{VISIBLE}={env[VISIBLE]!r}"
    smi = shutil.which("nvidia-smi", path=env.get("PATH"))
    if smi is not None:
        try:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            listed = ""
        count = sum(line.startswith("GPU ") for line in listed.splitlines())
        if count:
            return [str(i) for i in range(count)], "nvidia-smi -L"
    try:
        count = len(os.listdir(PROC_GPUS))
    except OSError:
        count = 0
    return [str(i) for i in range(count)], (PROC_GPUS if count else "no NVIDIA GPU found")


def split(gpus: Sequence[str], workers: int, per_worker: int | None, *, where: str = "") -> list[list[str]]:
    """Each of `workers` local workers' GPUs, in order: `per_worker` each (None: an even share of `gpus`;
    0: none, CPU workers). Raises ValueError, naming the flag and the fix, where they are not enough."""
    found = f"{len(gpus)} GPU(s) ({where})" if where else f"{len(gpus)} GPU(s)"
    if per_worker is None:
        if not gpus:
            return [[] for _ in range(workers)]
        if workers > len(gpus):
            raise ValueError(
                f"--workers {workers} on a machine with {found}: each worker needs a GPU of its own, or "
                f"TensorFlow puts several on one and takes its memory twice. Pass --workers {len(gpus)} (one per "
                f"GPU), or --gpus-per-worker 0 for {workers} workers on the CPUs.")
        per_worker = len(gpus) // workers
    if workers * per_worker > len(gpus):
        raise ValueError(
            f"--gpus-per-worker {per_worker} for {workers} worker(s) needs {workers * per_worker} GPUs, and this "
            f"machine has {found}. Pass --gpus-per-worker {len(gpus) // workers} (or 0 for CPU workers), or fewer "
            "--workers.")
    return [list(gpus[i * per_worker:(i + 1) * per_worker]) for i in range(workers)]


def visible(share: Sequence[str]) -> str:
    """CUDA_VISIBLE_DEVICES for a worker with `share`: its GPUs, or none at all for a CPU worker."""
    return ",".join(share) if share else NONE


def shares_text(shares: Sequence[Sequence[str]], gpus: Sequence[str]) -> str:
    """For the launcher's start line, e.g. "GPUs: worker 0 on 0,1; worker 1 on 2,3 (CUDA_VISIBLE_DEVICES)"."""
    parts = [f"worker {i} on {','.join(s) if s else 'the CPUs'}" for i, s in enumerate(shares)]
    idle = len(gpus) - sum(len(s) for s in shares)
    return (f"GPUs: {'; '.join(parts)} ({VISIBLE})"
            + (f"; {idle} GPU(s) left idle" if idle else ""))


def tasks_on_node(tasks_per_node: str, node_id: int) -> int:
    """The tasks on node `node_id` of a step, from Slurm's SLURM_STEP_TASKS_PER_NODE ("4(x2),2": 4 on each of
    the first two nodes, then 2)."""
    counts = []
    for item in tasks_per_node.split(","):
        count, _, repeat = item.partition("(x")
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    return counts[node_id]


def slurm_share(env: Mapping[str, str], seen: Sequence[str] | None = None) -> tuple[int, list[str], str] | None:
    """Under `srun`, where Slurm bound no GPUs to each task (no --gpus-per-task, no --gpu-bind) and several
    tasks share the node: this task's share of the node's GPUs by SLURM_LOCALID, as (its place in the GPUs
    the task sees, the share, CUDA_VISIBLE_DEVICES for it). None where there is nothing to change. Raises
    ValueError where the node has fewer GPUs than tasks. `seen`: the GPUs the task sees, where known
    (default: `machine_gpus`)."""
    if "SLURM_LOCALID" not in env or env.get("SLURM_GPUS_PER_TASK") or env.get("SLURM_GPU_BIND"):
        return None
    try:
        local_id = int(env["SLURM_LOCALID"])
        local_tasks = tasks_on_node(env.get("SLURM_STEP_TASKS_PER_NODE", "1"), int(env.get("SLURM_NODEID", "0")))
    except (ValueError, IndexError):
        return None  # Slurm's own variables unreadable: slurm_step() names them
    if local_tasks < 2:
        return None
    gpus, where = (list(seen), "as TensorFlow lists them") if seen is not None else machine_gpus(env)
    if not gpus:
        return None
    if local_tasks > len(gpus):
        raise ValueError(
            f"{local_tasks} tasks of this srun share a node with {len(gpus)} GPU(s) ({where}), and each needs one "
            f"of its own. Run as many tasks per node as GPUs (srun --ntasks-per-node={len(gpus)}), or bind "
            "them with --gpus-per-task=1.")
    share = split(gpus, local_tasks, None)[local_id]
    return gpus.index(share[0]), share, visible(share)
