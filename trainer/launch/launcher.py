"""Multi-process launcher, like torchrun: one process per task, TF_CONFIG set for each.

    trainer-launch --workers 2 script.py [args]          # MultiWorkerMirroredStrategy
    trainer-launch --workers 2 --ps 1 script.py [args]   # ParameterServerStrategy

This module is the command line only: it reads and checks the flags, so that a wrong one is a usage error
before anything starts, then hands over: a job's rounds to `job.py`, a serving task and an srun task to
`serve.py`. It must not run, watch or restart tasks itself. Every flag: docs/reference.md, "trainer-launch".
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

from trainer.distribute import gpus
from trainer.distribute.slurm import slurm_step
from trainer.launch import rendezvous
from trainer.launch.agreement import nodes_text
from trainer.launch.job import PORT_BASE_ENV, fixed_ports, free_ports, run, run_nodes
from trainer.launch.secret import SECRET_ENV, read_secret
from trainer.launch.serve import check_serve_config, run_slurm_task, serve
from trainer.launch.supervise import say


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
    parser.add_argument("--gpus-per-worker", type=_count("--gpus-per-worker", 0), default=None,
                        help="GPUs each worker on this machine computes on, given through CUDA_VISIBLE_DEVICES "
                             "(default: an even share of the machine's GPUs, or of the CUDA_VISIBLE_DEVICES you "
                             "set; 0: CPU workers)")
    parser.add_argument("--check", action="store_true",
                        help="run the self-check (python -m trainer.check) as the script: whether one device's "
                             "numbers hold on these workers, and what they give; takes no script")
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
    nodes.add_argument("--task-port-base", type=_count("--task-port-base", 1024), default=None, metavar="PORT",
                       help=f"the first of this machine's task ports, which count up from it: one per worker and "
                            f"ps task, and one for a chief (default: ${PORT_BASE_ENV}, else ports the system "
                            f"chooses); fixed ports let a firewall between the machines through")
    nodes.add_argument("--node-addr", default=None,
                       help="the address the other machines reach this one's tasks by (default: --master-addr on "
                            "node 0, elsewhere the address this machine reaches node 0 from)")
    nodes.add_argument("--rdzv-secret-file", default=None, metavar="FILE",
                       help=f"a file whose first line is the job's shared secret, which every node presents at the "
                            f"rendezvous (default: ${SECRET_ENV}); never pass the secret itself")
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
    if args.check:
        if args.script is not None:
            parser.error(f"--check runs the self-check in place of a script. Received: {args.script!r}. Drop the "
                         "script (trainer-launch --workers 2 --check), or drop --check to run it.")
        if args.ps:
            parser.error(f"--check trains on workers in sync, which parameter servers are not. Received: --ps "
                         f"{args.ps}. Drop --ps: trainer-launch --workers 2 --check.")
        args.script, args.args = "-m", ["trainer.check"]
    elif args.script is None:
        parser.error("the script to run is missing. Received: no script argument. "
                     "Pass it after the options: trainer-launch --workers 2 train.py [args]")
    if not args.check and not os.path.isfile(args.script):
        found = "a directory" if os.path.isdir(args.script) else "no such file"
        parser.error(f"the script must be an existing Python file. Received: {args.script!r} ({found}, looked "
                     f"for from {os.getcwd()}). Check the path: trainer-launch --workers 2 train.py [args]")
    command = [sys.executable, args.script, *args.args]
    step = slurm_step()
    least, most = args.nnodes
    if step is not None and step.num_tasks > 1 and not os.environ.get("TF_CONFIG"):
        for flag, value, default in (("--workers", args.workers, None), ("--nnodes", args.nnodes, (1, 1)),
                                     ("--max-restarts", args.max_restarts, 0),
                                     ("--gpus-per-worker", args.gpus_per_worker, None),
                                     ("--task-port-base", args.task_port_base, None)):
            if value != default:
                shown = nodes_text(value) if flag == "--nnodes" else value
                parser.error(f"under srun, the step's {step.num_tasks} tasks are the cluster. Received: {flag} "
                             f"{shown}. Drop {flag} (choose the tasks with srun -n and -N, and restarts with "
                             "sbatch --requeue, the GPUs with srun --gpus-per-task, the ports with "
                             "TRAINER_SLURM_PORT_BASE), keep --ps if you want it.")
        try:
            return run_slurm_task(step, command, args.ps)
        except ValueError as err:  # the parameter-server cluster the step's tasks cannot make: nothing started
            parser.error(str(err))
    if most == 1:
        if args.node_rank != 0 or args.master_addr is not None or args.node_addr is not None:
            parser.error(f"--node-rank, --master-addr and --node-addr place this machine in a job over several, but "
                         f"--nnodes is 1. Received: --node-rank {args.node_rank}, --master-addr {args.master_addr!r}, "
                         f"--node-addr {args.node_addr!r}. Pass --nnodes N on every machine, or drop them to train "
                         "on this one.")
        workers = args.workers or 2
        ports = _task_ports(parser, args.task_port_base, workers + args.ps + (1 if args.ps else 0))
        return run(command, workers=workers, ps=args.ps, max_restarts=args.max_restarts, ports=ports,
                   gpu_shares=_gpu_shares(parser, workers, args.gpus_per_worker))
    shown = nodes_text(args.nnodes)
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
        secret = read_secret(args.rdzv_secret_file)
    except ValueError as err:
        parser.error(str(err))
    workers = args.workers or 1
    ports = _task_ports(parser, args.task_port_base, workers + args.ps + 1)
    shares = _gpu_shares(parser, workers, args.gpus_per_worker)  # last: its start line says the job will run
    return run_nodes(command, nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
                     master_port=args.master_port, workers=workers, ps=args.ps, secret=secret, gpu_shares=shares,
                     ports=ports,
                     node_addr=args.node_addr, max_restarts=args.max_restarts, last_call=float(args.rdzv_last_call),
                     timeout=float(args.rdzv_timeout))


def _gpu_shares(parser: argparse.ArgumentParser, workers: int, per_worker: int | None) -> list[list[str]] | None:
    """Each local worker's GPUs (`gpus.split`), said in a start line; None on a machine without GPUs, where the
    workers' environment stays as it is. A split that can't be made is a usage error, before anything starts."""
    found, where = gpus.machine_gpus()
    try:
        shares = gpus.split(found, workers, per_worker, where=where)
    except ValueError as err:
        parser.error(str(err))
    if not found:
        return None
    say(sys.stdout, gpus.shares_text(shares, found))
    return shares


def _task_ports(parser: argparse.ArgumentParser, base: int | None, count: int) -> Callable[[int], list[int]]:
    """Where the tasks' ports come from: `count` from --task-port-base (or its variable) up, checked free now,
    so that a port that is taken is a usage error before anything starts; else ports the system chooses."""
    if base is None and os.environ.get(PORT_BASE_ENV):
        given = os.environ[PORT_BASE_ENV]
        base = int(given) if given.isdigit() else -1
        if not 1024 <= base <= 65535 - count:
            parser.error(f"{PORT_BASE_ENV} must be a port from 1024 to {65535 - count}, the first of this "
                         f"machine's {count} task ports. Received: {PORT_BASE_ENV}={given!r}. Set it to e.g. 23456, "
                         "or unset it to let the system choose.")
    if base is None:
        return free_ports
    if base > 65535 - count:
        parser.error(f"--task-port-base must leave room for this machine's {count} task ports (at most "
                     f"{65535 - count}). Received: --task-port-base {base}. Pass e.g. --task-port-base 23456.")
    ports = fixed_ports(base)
    try:
        ports(count)
    except ValueError as err:
        parser.error(str(err))
    return ports
