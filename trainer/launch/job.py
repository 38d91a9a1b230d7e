"""A job on this machine, round after round: the tasks of a local cluster (`run`, on ports of `free_ports`), or
this machine's part of a job over several, met at node 0's rendezvous (`run_nodes`); after a failure, with
restarts left, the next round starts, and fit resumes from the backup the tasks' environment names.

Takes what to run as arguments, never from the command line (`launcher.py` reads that), and starts no
process itself: `supervise.py` runs and stops each round's tasks. It must keep the job's secret out of the
tasks' environment. Pure Python: no TensorFlow here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import sys
from typing import Callable, Mapping, Sequence

from trainer.distribute.cluster import BACKUP_DIR_ENV
from trainer.launch import links, rendezvous
from trainer.launch.agreement import Round, layout
from trainer.launch.secret import SECRET_ENV
from trainer.launch.supervise import run_tasks, say, stop_requests


def free_ports(count: int) -> list[int]:
    """`count` distinct localhost ports that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]


PORT_BASE_ENV = "TRAINER_TASK_PORT_BASE"  # the first of each machine's task ports, as --task-port-base gives it


def fixed_ports(base: int) -> Callable[[int], list[int]]:
    """For `free_ports`'s place: `count` ports from `base` up, the same at every round, so that a firewall
    between the machines can let them through. Raises ValueError naming a port that is taken."""

    def ports(count: int) -> list[int]:
        chosen = list(range(base, base + count))
        for port in chosen:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the tasks' servers bind
                try:
                    s.bind(("", port))
                except OSError as err:
                    raise ValueError(
                        f"--task-port-base {base} gives this machine's {count} tasks the ports {base}-"
                        f"{base + count - 1}, and port {port} is taken ({err.strerror}). Pass another "
                        f"--task-port-base (or {PORT_BASE_ENV}), or drop it to let the system choose.") from None
        return chosen

    return ports


def cluster_spec(workers: int, ps: int, ports: Sequence[int]) -> dict[str, list[str]]:
    """The cluster dict: workers only (worker 0 is chief), or chief + workers + ps with --ps."""
    addresses = [f"localhost:{p}" for p in ports]
    if ps == 0:
        return {"worker": addresses[:workers]}
    return {"chief": addresses[:1], "worker": addresses[1 : 1 + workers],
            "ps": addresses[1 + workers : 1 + workers + ps]}


def tasks(cluster: dict[str, list[str]]) -> list[tuple[str, int]]:
    """Every (task type, index) in the cluster, chief first."""
    order = ("chief", "worker", "ps")
    return [(kind, i) for kind in order for i in range(len(cluster.get(kind, [])))]


def run(
    command: Sequence[str],
    *,
    workers: int,
    ps: int = 0,
    max_restarts: int = 0,
    env: dict[str, str] | None = None,
    out=None,
    server_command: Callable[[str, int], list[str]] | None = None,
    gpu_shares: list[list[str]] | None = None,
    ports: Callable[[int], list[int]] = free_ports,
) -> int:
    """Runs `command` as every computing task of a local cluster; returns the exit status.

    Args:
      command: the program and its arguments, e.g. [sys.executable, "train.py"].
      workers: worker tasks.
      ps: parameter-server tasks; with any, the command runs on a chief and the
        workers and ps tasks run TensorFlow servers.
      max_restarts: times every task starts again after one fails (the script
        resumes from its backup, which the launcher's `TRAINER_BACKUP_DIR` gives).
      env: the environment (default: this process's).
      out: where prefixed lines go (default: stdout).
      gpu_shares: each local worker's GPUs (`trainer.distribute.gpus.split`); None leaves CUDA_VISIBLE_DEVICES
        as the environment has it.
      ports: `count` -> ports for the tasks (`free_ports`, or `fixed_ports`).
    """
    out = out or sys.stdout
    env = _elastic_env(os.environ if env is None else env, max_restarts, out)
    with stop_requests() as requested:
        restart = 0
        while True:
            cluster = cluster_spec(workers, ps, ports(workers + ps + (1 if ps else 0)))
            origin = "trainer-launch on this machine" + (f", restart {restart} of {max_restarts}" if restart else "")
            link = links.Alone(can_restart=restart < max_restarts)
            status = run_tasks(command, cluster, tasks(cluster), origin=origin, env=env, out=out,
                               server_command=server_command, link=link, requested=requested,
                               gpu_shares=gpu_shares)
            if not _restarts(link, status, restart, max_restarts, out):
                return status
            restart += 1


def _restarts(link, status: int, restart: int, max_restarts: int, out, after: str = "") -> bool:
    """Whether the job starts again after a round that ended with `status`; says so, or why not."""
    if status == 0:
        return False
    if link.rejoin:
        say(out, f"restart {restart + 1} of {max_restarts}: {link.why}; starting again{after}")
        return True
    if max_restarts and restart == max_restarts:
        say(out, f"no restart left ({max_restarts} of {max_restarts} used): {link.why}; exiting with status {status}")
    return False


def _elastic_env(env: Mapping[str, str], max_restarts: int, out) -> dict[str, str]:
    """The tasks' environment: with restarts, a backup folder for the script (unless it was given one)."""
    env = dict(env)
    if max_restarts and not env.get(BACKUP_DIR_ENV):
        env[BACKUP_DIR_ENV] = os.path.abspath("trainer-backup")
        say(out, f"backups in {env[BACKUP_DIR_ENV]} ({BACKUP_DIR_ENV}): after a restart, fit resumes from them")
    return env


def run_nodes(command: Sequence[str], *, nnodes: tuple[int, int], node_rank: int, master_addr: str,
              master_port: int, workers: int, secret: bytes, ps: int = 0, node_addr: str | None = None,
              max_restarts: int = 0, last_call: float = 10.0, timeout: float = rendezvous.DEFAULT_TIMEOUT,
              env: dict[str, str] | None = None, out=None, gpu_shares: list[list[str]] | None = None,
              ports: Callable[[int], list[int]] = free_ports) -> int:
    """This machine's part of a job over `nnodes` = (least, most) machines: meets the others at node 0's
    rendezvous (with the job's `secret`), runs its own tasks, and stops with the others when any node fails
    or goes; with restarts left, meets the nodes that are left again and starts over. Returns the exit
    status."""
    out = out or sys.stdout
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != SECRET_ENV}
    env = _elastic_env(env, max_restarts, out)  # every node's workers back up (node 0 checks they all restart)
    with contextlib.ExitStack() as stack:
        requested = stack.enter_context(stop_requests())
        host = None
        if node_rank == 0:
            try:
                host = stack.enter_context(rendezvous.Host(master_addr, master_port))
            except rendezvous.RendezvousError as err:
                say(out, f"node 0: {err}")
                return 1
        round_ = Round(max_restarts=max_restarts, nodes=nnodes, last_call=last_call)
        while True:
            try:
                plan = rendezvous.join(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                                       master_port=master_port, workers=workers, ps=ps, timeout=timeout,
                                       free_ports=ports, secret=secret, node_addr=node_addr, host=host,
                                       round_=round_, interrupted=lambda: bool(requested))
            except rendezvous.JobEnded as ended:
                say(out, str(ended))
                return 0
            except rendezvous.RendezvousError as err:  # most name the node already ("node 1 could not reach ...")
                say(out, str(err) if str(err).startswith("node ") else f"node {node_rank}: {err}")
                return 128 + requested[0] if requested else 1
            if requested:
                plan.link.stopping(128 + requested[0], "interrupted", leaving=True)
                return plan.link.finish(128 + requested[0])
            if plan.restart:
                before = f" (before: {round_.previous})" if round_.previous else ""
                say(out, f"restart {plan.restart} of {max_restarts}: {layout(plan.cluster, plan.nodes)} "
                          f"now{before}")
            status = run_tasks(command, plan.cluster, plan.tasks, origin=plan.origin, env=env, out=out,
                               link=plan.link, requested=requested, gpu_shares=gpu_shares)
            if not _restarts(plan.link, status, plan.restart, max_restarts, out, after=": meeting at the rendezvous"):
                if host is not None and status == 0:
                    host.dismiss("the job completed while this node waited to join it at a restart; nothing to do")
                return status
            round_ = dataclasses.replace(round_, restart=plan.restart + 1,
                                         previous=layout(plan.cluster, plan.nodes))
