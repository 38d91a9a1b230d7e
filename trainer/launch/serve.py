"""The tasks that serve rather than run the script: a parameter-server cluster's workers and ps tasks.

    trainer-launch --serve                              # this task, as TF_CONFIG names it, until killed
    srun -n 4 trainer-launch --ps 1 script.py [args]   # under Slurm: task 0 runs the script, the others serve

Under Slurm the servers end by themselves once the chief's script has ended,
so that `srun` returns with the chief's status.
"""

from __future__ import annotations

import json
import os
import socket
import time

from trainer.distribute.cluster import LAUNCHER_MARK
from trainer.distribute import gpus
from trainer.distribute.slurm import SlurmStep, ps_cluster, slurm_addresses, task_of


def serve(until_gone: str | None = None) -> None:
    """Runs this task's TensorFlow server (a worker or ps task of a parameter-server cluster) until killed,
    or, with `until_gone` (the chief's "host:port"), until the chief has come and gone.

    Raises:
      ValueError: if TF_CONFIG does not name a worker or ps task of a cluster with ps tasks.
    """
    check_serve_config()
    import tensorflow as tf

    from trainer.engine import malloc

    # The steps scheduled here read tf.data iterators, which would pin glibc's
    # mmap threshold at 128 KiB for good; nothing of ours runs after them.
    malloc.pin_then_raise()
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                                  task_index=resolver.task_id, protocol="grpc", start=True)
    if until_gone is None:
        server.join()
    else:
        _wait_for_the_chief(until_gone)


def _wait_for_the_chief(address: str, poll: float = 1.0, gone_after: int = 3, start_timeout: float = 600.0) -> None:
    """Returns once the chief's server at `address` has answered and then stopped answering `gone_after`
    times in a row (its script ended); raises if it never answers within `start_timeout` seconds."""
    host, port = address.rsplit(":", 1)
    seen, misses, deadline = False, 0, time.monotonic() + start_timeout
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=poll).close()
            seen, misses = True, 0
        except OSError:
            misses += 1
            if seen and misses >= gone_after:
                return
            if not seen and time.monotonic() > deadline:
                raise RuntimeError(f"The chief at {address} never answered in {start_timeout:.0f} s: did task 0 "
                                   "start the script (srun ... trainer-launch --ps N script.py)?")
        time.sleep(poll)


def run_slurm_task(step: SlurmStep, command: list[str], ps: int) -> int:
    """This task's part of an `srun` of trainer-launch: with `ps`, task 0 runs the script as the chief and the
    others serve (the last `ps` as ps tasks) until it is gone; without, every task runs the script, which
    reads Slurm's environment itself. Where Slurm bound no GPUs to each task, a task computes on its share
    of its node's GPUs (`gpus.slurm_share`)."""
    share = gpus.slurm_share(os.environ)
    if share is not None:
        os.environ[gpus.VISIBLE] = share[2]
        print(f"[launcher] task {step.task_id}: GPUs {share[2]} ({gpus.VISIBLE}; Slurm bound none to the task)",
              flush=True)
    if ps == 0:
        os.execv(command[0], command)
    from trainer import _compat

    cluster = ps_cluster(slurm_addresses(step, _compat.expand_hostlist, _compat.expand_tasks_per_node), ps)
    kind, index = task_of(step.task_id, cluster)
    os.environ["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
    os.environ[LAUNCHER_MARK] = f"trainer-launch under Slurm (job {step.job_id}, step {step.step_id})"
    if kind == "chief":
        os.execv(command[0], command)
    serve(until_gone=cluster["chief"][0])
    return 0


def check_serve_config() -> None:
    """Raises ValueError unless TF_CONFIG names a worker or ps task of a cluster with ps tasks."""
    from trainer.distribute import cluster

    info = cluster.cluster_info()
    if info.task_type not in ("worker", "ps") or info.num_ps == 0:
        raise ValueError(
            "`trainer-launch --serve` runs a worker or ps task of a parameter-server cluster, so TF_CONFIG must "
            f"name one. Received: task type {info.task_type!r} in a cluster with {info.num_ps} ps task(s) "
            f"(TF_CONFIG={os.environ.get('TF_CONFIG')!r}). Under --serve, set TF_CONFIG's task to "
            '{"type": "worker" or "ps", "index": i} of a cluster with "ps" tasks; the chief, and every task of '
            "a cluster without ps tasks, runs the training script itself.")
