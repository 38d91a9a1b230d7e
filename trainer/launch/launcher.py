"""Multi-process launcher, like torchrun: one process per task, TF_CONFIG set for each.

    trainer-launch --workers 2 script.py [args]          # MultiWorkerMirroredStrategy
    trainer-launch --workers 2 --ps 1 script.py [args]   # ParameterServerStrategy
    python -m trainer.launch --workers 2 script.py [args]

On several machines, run it on each with its own --node-rank (--workers per
machine, default 1: a worker computes on all of its machine's GPUs):

    export TRAINER_RDZV_SECRET=...   # the same on every machine (or --rdzv-secret-file FILE)
    trainer-launch --nnodes 2 --node-rank R --master-addr HOST0 --master-port 29400 script.py [args]

Each output line is prefixed with the task's role and index. If a task fails,
the others are stopped (on every machine) and the launcher exits with that
task's status. Ctrl-C stops everything; so does a machine's launcher gone.
With --max-restarts N the job starts again instead (on the machines left, with
--nnodes MIN:MAX), and fit resumes from the backup the launcher asks it for:

    trainer-launch --workers 2 --max-restarts 3 script.py [args]
With --ps, the script runs on the chief (the coordinator); the worker and ps
tasks run TensorFlow servers:

    trainer-launch --serve    # a worker or ps task of a parameter-server cluster, as TF_CONFIG names it

which is also the command for those tasks on a cluster (Kubernetes, cloud jobs).
Under Slurm, as every task of an srun step, it runs this task's part of the step:

    srun -n 4 trainer-launch --ps 1 script.py [args]   # task 0 the chief, task 3 the ps, 1-2 the workers
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import socket
import sys
from typing import Callable, Mapping, Sequence

from trainer.distribute.cluster import BACKUP_DIR_ENV
from trainer.distribute.slurm import slurm_step
from trainer.launch import links, rendezvous
from trainer.launch.serve import check_serve_config, run_slurm_task, serve
from trainer.launch.supervise import run_tasks, say, stop_requests


def free_ports(count: int) -> list[int]:
    """`count` distinct localhost ports that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]


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
    """
    out = out or sys.stdout
    env = _elastic_env(os.environ if env is None else env, max_restarts, out)
    with stop_requests() as requested:
        restart = 0
        while True:
            cluster = cluster_spec(workers, ps, free_ports(workers + ps + (1 if ps else 0)))
            origin = "trainer-launch on this machine" + (f", restart {restart} of {max_restarts}" if restart else "")
            link = links.Alone(can_restart=restart < max_restarts)
            status = run_tasks(command, cluster, tasks(cluster), origin=origin, env=env, out=out,
                               server_command=server_command, link=link, requested=requested)
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
              env: dict[str, str] | None = None, out=None) -> int:
    """This machine's part of a job over `nnodes` = (least, most) machines: meets the others at node 0's
    rendezvous (with the job's `secret`), runs its own tasks, and stops with the others when any node fails
    or goes; with restarts left, meets the nodes that are left again and starts over. Returns the exit
    status."""
    out = out or sys.stdout
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != rendezvous.SECRET_ENV}
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
        round_ = rendezvous.Round(max_restarts=max_restarts, nodes=nnodes, last_call=last_call)
        while True:
            try:
                plan = rendezvous.join(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                                       master_port=master_port, workers=workers, ps=ps, timeout=timeout,
                                       free_ports=free_ports, secret=secret, node_addr=node_addr, host=host,
                                       round_=round_, interrupted=lambda: bool(requested))
            except rendezvous.JobEnded as ended:
                say(out, str(ended))
                return 0
            except rendezvous.RendezvousError as err:
                say(out, f"node {node_rank}: {err}")
                return 128 + requested[0] if requested else 1
            if requested:
                plan.link.stopping(128 + requested[0], "interrupted", leaving=True)
                return plan.link.finish(128 + requested[0])
            if plan.restart:
                before = f" (before: {round_.previous})" if round_.previous else ""
                say(out, f"restart {plan.restart} of {max_restarts}: {rendezvous.layout(plan.cluster, plan.nodes)} "
                          f"now{before}")
            status = run_tasks(command, plan.cluster, plan.tasks, origin=plan.origin, env=env, out=out,
                               link=plan.link, requested=requested)
            if not _restarts(plan.link, status, plan.restart, max_restarts, out, after=": meeting at the rendezvous"):
                if host is not None and status == 0:
                    host.dismiss("the job completed while this node waited to join it at a restart; nothing to do")
                return status
            round_ = dataclasses.replace(round_, restart=plan.restart + 1,
                                         previous=rendezvous.layout(plan.cluster, plan.nodes))


def _count(flag: str, minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`, with an error that names `flag`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"{flag} must be an integer >= {minimum}. Received: {flag} {text!r}. "
                                             f"Pass e.g. {flag} {max(minimum, 2)}.")
        return value

    return parse


def _node_range(text: str) -> tuple[int, int]:
    """An argparse type for --nnodes: N, or MIN:MAX with 1 <= MIN <= MAX; (least, most) nodes."""
    parts = text.split(":")
    try:
        least, most = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        least = most = None
    if least is None or not 1 <= least <= most:
        raise argparse.ArgumentTypeError(
            f"--nnodes must be a number of machines N >= 1, or MIN:MAX with 1 <= MIN <= MAX. Received: --nnodes "
            f"{text!r}. Pass e.g. --nnodes 2, or --nnodes 1:2 for a job that goes on with one machine left.")
    return least, most


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainer-launch", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=_count("--workers", 1), default=None,
                        help="worker tasks on this machine (default 2; 1 with --nnodes, where a worker uses all of "
                             "its machine's GPUs; under srun, srun's tasks are the workers)")
    parser.add_argument("--ps", type=_count("--ps", 0), default=0,
                        help="parameter-server tasks on this machine (default 0)")
    parser.add_argument("--serve", action="store_true",
                        help="run this task's TensorFlow server: the worker and ps tasks of a parameter-server "
                             "cluster, as TF_CONFIG names them")
    nodes = parser.add_argument_group("several machines (run trainer-launch on each, with its own --node-rank)")
    nodes.add_argument("--nnodes", type=_node_range, default=(1, 1),
                       help="machines in the job (default 1), or MIN:MAX for an elastic job that goes on while at "
                            "least MIN are there")
    nodes.add_argument("--node-rank", type=_count("--node-rank", 0), default=0,
                       help="this machine's rank, 0 to nnodes-1; node 0 serves the rendezvous and runs the chief")
    nodes.add_argument("--master-addr", default=None, help="node 0's address, as the other machines reach it")
    nodes.add_argument("--master-port", type=_count("--master-port", 1), default=rendezvous.DEFAULT_MASTER_PORT,
                       help=f"node 0's rendezvous port (default {rendezvous.DEFAULT_MASTER_PORT})")
    nodes.add_argument("--node-addr", default=None,
                       help="the address the other machines reach this one's tasks by (default: --master-addr on "
                            "node 0, elsewhere the address this machine reaches node 0 from)")
    nodes.add_argument("--rdzv-secret-file", default=None, metavar="FILE",
                       help=f"a file whose first line is the job's shared secret, which every node presents at the "
                            f"rendezvous (default: ${rendezvous.SECRET_ENV}); never pass the secret itself")
    parser.add_argument("--max-restarts", type=_count("--max-restarts", 0), default=0,
                        help="times every task starts again after a task or a node fails, or a node is preempted; "
                             "the script resumes from its last backup (default 0)")
    nodes.add_argument("--rdzv-last-call", type=_count("--rdzv-last-call", 0), default=10,
                       help="with --nnodes MIN:MAX, seconds to wait for more nodes once MIN are there (default 10)")
    nodes.add_argument("--rdzv-timeout", type=_count("--rdzv-timeout", 1), default=int(rendezvous.DEFAULT_TIMEOUT),
                       help=f"seconds for every node to arrive (default {rendezvous.DEFAULT_TIMEOUT:.0f})")
    parser.add_argument("script", nargs="?", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    args = parser.parse_args(argv)
    if args.serve:
        if args.script is not None:
            parser.error(f"--serve takes no script: it runs a TensorFlow server. Received: {args.script!r}. "
                         "Run the script on the chief only (trainer-launch --serve on the worker and ps tasks).")
        try:
            check_serve_config()
        except ValueError as err:
            parser.error(str(err))
        serve()
        return 0
    if args.script is None:
        parser.error("the script to run is missing. Received: no script argument. "
                     "Pass it after the options: trainer-launch --workers 2 train.py [args]")
    if not os.path.isfile(args.script):
        found = "a directory" if os.path.isdir(args.script) else "no such file"
        parser.error(f"the script must be an existing Python file. Received: {args.script!r} ({found}, looked "
                     f"for from {os.getcwd()}). Check the path: trainer-launch --workers 2 train.py [args]")
    command = [sys.executable, args.script, *args.args]
    step = slurm_step()
    least, most = args.nnodes
    if step is not None and step.num_tasks > 1 and not os.environ.get("TF_CONFIG"):
        for flag, value, default in (("--workers", args.workers, None), ("--nnodes", args.nnodes, (1, 1)),
                                     ("--max-restarts", args.max_restarts, 0)):
            if value != default:
                shown = rendezvous.nodes_text(value) if flag == "--nnodes" else value
                parser.error(f"under srun, the step's {step.num_tasks} tasks are the cluster. Received: {flag} "
                             f"{shown}. Drop {flag} (choose the tasks with srun -n and -N, and restarts with "
                             "sbatch --requeue), keep --ps if you want it.")
        return run_slurm_task(step, command, args.ps)
    if most == 1:
        if args.node_rank != 0 or args.master_addr is not None or args.node_addr is not None:
            parser.error(f"--node-rank, --master-addr and --node-addr place this machine in a job over several, but "
                         f"--nnodes is 1. Received: --node-rank {args.node_rank}, --master-addr {args.master_addr!r}, "
                         f"--node-addr {args.node_addr!r}. Pass --nnodes N on every machine, or drop them to train "
                         "on this one.")
        return run(command, workers=args.workers or 2, ps=args.ps, max_restarts=args.max_restarts)
    shown = rendezvous.nodes_text(args.nnodes)
    if args.node_rank >= most:
        parser.error(f"--node-rank must be 0 to {most - 1} (--nnodes {shown}). Received: --node-rank "
                     f"{args.node_rank}. Give each machine its own rank; node 0 serves the rendezvous.")
    if args.master_addr is None:
        parser.error(f"--nnodes {shown} needs --master-addr: node 0's address, the same on every machine. "
                     "Received: no --master-addr. Pass e.g. --master-addr node0.example.org (or its IP).")
    if least < most and args.max_restarts == 0:
        parser.error(f"--nnodes {shown} lets the job go on with fewer nodes, which takes restarts. Received: "
                     "--max-restarts 0. Pass e.g. --max-restarts 3, or --nnodes N for a fixed number of nodes.")
    if args.node_addr is not None and not args.node_addr.strip():
        parser.error("--node-addr must be this machine's address as the others reach it. Received: --node-addr ''. "
                     "Pass e.g. --node-addr 10.0.0.5, or drop it to use the address that reaches node 0.")
    try:
        secret = rendezvous.read_secret(args.rdzv_secret_file)
    except ValueError as err:
        parser.error(str(err))
    return run_nodes(command, nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
                     master_port=args.master_port, workers=args.workers or 1, ps=args.ps, secret=secret,
                     node_addr=args.node_addr, max_restarts=args.max_restarts, last_call=float(args.rdzv_last_call),
                     timeout=float(args.rdzv_timeout))

