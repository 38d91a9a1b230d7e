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
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from queue import Empty
from typing import Any, Callable, Sequence

from trainer import rendezvous
from trainer.cluster import LAUNCHER_MARK
from trainer.serve import check_serve_config, run_slurm_task, serve
from trainer.slurm import slurm_step
from trainer.quiet import NoticeFilter, startup_notices_hidden, user_chose_logs

GRACE_SECONDS = 10.0  # between SIGTERM (time to save a backup) and SIGKILL


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


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def _pump(stream, prefix: str, out, hide_notices: bool = False) -> None:
    """Passes a task's lines on with its prefix; with `hide_notices`, without TensorFlow's start-up notices."""
    notices = NoticeFilter()
    for line in iter(stream.readline, ""):
        if hide_notices and not notices.passes(line):
            continue
        out.write(f"{prefix}{line}" if line.endswith("\n") else f"{prefix}{line}\n")
        out.flush()


class _Task:
    """One task's process; `process` stays None if it could not be started."""

    def __init__(self, kind: str, index: int):
        self.name = f"{kind}:{index}"
        self.process: subprocess.Popen | None = None
        self.pump: threading.Thread | None = None

    def start(self, command: list[str], env: dict[str, str], out, hide_notices: bool = False) -> None:
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True,  # Ctrl-C reaches the launcher only, which stops the tasks in order
            preexec_fn=_die_with_the_launcher if _prctl is not None else None,
        )
        self.pump = threading.Thread(target=_pump, args=(self.process.stdout, f"[{self.name}] ", out, hide_notices),
                                     daemon=True)
        self.pump.start()

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)


def _load_prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # Linux; loaded here, not in the forked child
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_the_launcher() -> None:
    """Runs in a task's process before its program: the task is killed when the launcher dies, so a
    launcher killed outright (SIGKILL, the out-of-memory killer, its machine gone) leaves no task behind."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N -> 128 + N


def run(
    command: Sequence[str],
    *,
    workers: int,
    ps: int = 0,
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
      env: the environment (default: this process's).
      out: where prefixed lines go (default: stdout).
    """
    cluster = cluster_spec(workers, ps, free_ports(workers + ps + (1 if ps else 0)))
    return run_tasks(command, cluster, tasks(cluster), origin="trainer-launch on this machine", env=env, out=out,
                     server_command=server_command)


def run_nodes(command: Sequence[str], *, nnodes: int, node_rank: int, master_addr: str, master_port: int,
              workers: int, secret: bytes, ps: int = 0, node_addr: str | None = None,
              timeout: float = rendezvous.DEFAULT_TIMEOUT, env: dict[str, str] | None = None, out=None) -> int:
    """This machine's part of a job over `nnodes` machines: meets the others at node 0's rendezvous (with the
    job's `secret`), runs its own tasks, and stops with the others when any node fails or goes; returns the
    exit status."""
    out = out or sys.stdout
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != rendezvous.SECRET_ENV}
    with _stop_requests() as requested:
        try:
            plan = rendezvous.join(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr,
                                   master_port=master_port, workers=workers, ps=ps, timeout=timeout,
                                   free_ports=free_ports, secret=secret, node_addr=node_addr,
                                   interrupted=lambda: bool(requested))
        except rendezvous.RendezvousError as err:
            _say(out, f"node {node_rank}: {err}")
            return 128 + requested[0] if requested else 1
        if requested:
            plan.link.stopping(128 + requested[0], "interrupted")
            return plan.link.finish(128 + requested[0])
        origin = f"trainer-launch on {nnodes} nodes (node 0 at {master_addr})"
        return run_tasks(command, plan.cluster, plan.tasks, origin=origin, env=env, out=out, link=plan.link,
                         requested=requested)


def run_tasks(command, cluster: dict[str, list[str]], own: list[tuple[str, int]], *, origin: str,
              env: dict[str, str] | None = None, out=None, server_command=None, link=None,
              requested: list[int] | None = None) -> int:
    """Runs this machine's tasks `own` of `cluster` and supervises them; returns the exit status."""
    out = out or sys.stdout
    link = link or rendezvous.Alone()
    base_env = {**(os.environ if env is None else env), LAUNCHER_MARK: origin}
    with contextlib.ExitStack() as stack:
        if requested is None:
            requested = stack.enter_context(_stop_requests())
        running = _start_tasks(cluster, own, command, server_command or _server_command, base_env, out, requested)
        with_ps = "ps" in cluster
        script_tasks = [t for t in running if not with_ps or t.name == "chief:0"]
        return _supervise(running, out, script_tasks, requested, link)


def _start_tasks(cluster, own, command, server_command, base_env, out, requested: list[int]) -> list[_Task]:
    """Starts this machine's tasks (until a stop is requested); if one can't start, stops those that did."""
    with_ps = "ps" in cluster
    running: list[_Task] = []
    try:
        for kind, index in own:
            if requested:
                break
            task_env = {**base_env, "TF_CONFIG": tf_config(cluster, kind, index)}
            hide_notices = not user_chose_logs(base_env)  # TensorFlow's start-up notices, once per task
            chief = (kind, index) in (("chief", 0), ("worker", 0)) and (not with_ps or kind == "chief")
            if not chief:
                task_env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # non-chief tasks: warnings and errors only
            runs_script = not with_ps or kind == "chief"
            task = _Task(kind, index)
            running.append(task)
            task.start(list(command) if runs_script else server_command(kind, index), task_env, out, hide_notices)
    except BaseException:
        _stop(running)
        raise
    return running


@contextlib.contextmanager
def _stop_requests():
    """The stop signals received while the launcher runs: Ctrl-C (SIGINT), and SIGTERM (a preempted job).

    The handler only records the signal; the supervising loop stops the tasks. An exception raised by the
    handler could land inside `subprocess`'s own bookkeeping (between taking and releasing a Popen's wait
    lock), after which waiting for that task would block for good. Off the main thread, where Python
    delivers no signals, nothing is installed; a signal the parent ignores (a background job's Ctrl-C)
    stays ignored.
    """
    requested: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, lambda received, frame: requested.append(received))
    try:
        yield requested
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)  # None: set outside Python


def _supervise(running: list[_Task], out, script_tasks: list[_Task], requested: list[int], link) -> int:
    """Waits for a stop request, a failed task, a stop from another node (`link`) or the script's end; then
    stops the rest. Returns the status."""
    while True:
        failed = next((t for t in running if t.process.poll() not in (None, 0)), None)
        news = link.poll()
        if requested:
            status, stopping = 128 + requested[0], running
            _say(out, "interrupted; stopping every task")
            link.stopping(status, "interrupted")
        elif failed is not None:
            status, stopping = _exit_status(failed.process.returncode), [t for t in running if t is not failed]
            why = f"task {failed.name} failed with exit status {status}"
            _say(out, f"{why}; stopping the others")
            link.stopping(status, why)
        elif news is not None:
            (status, why), stopping = news, running
            if status != 0:
                _say(out, f"{why}; stopping every task here")
        elif script_tasks and all(t.process.poll() == 0 for t in script_tasks):
            status, stopping = 0, [t for t in running if t not in script_tasks]  # servers run until told to stop
        else:
            time.sleep(0.1)
            continue
        _stop(stopping)
        for task in running:  # let every task's last lines through
            task.pump.join(timeout=5)
        return link.finish(status)


def _say(out, message: str) -> None:
    out.write(f"[launcher] {message}\n")
    out.flush()


def _stop(tasks_: list[_Task]) -> None:
    """SIGTERM to each task's process group (time to save a backup); SIGKILL after GRACE_SECONDS."""
    live = [t for t in tasks_ if t.process is not None and t.process.poll() is None]
    for task in live:
        task.signal(signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    for task in live:
        try:
            task.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            task.signal(signal.SIGKILL)
            task.process.wait()


def _server_command(kind: str, index: int) -> list[str]:
    return [sys.executable, "-m", "trainer.launch", "--serve"]


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
    nodes.add_argument("--nnodes", type=_count("--nnodes", 1), default=1, help="machines in the job (default 1)")
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
    if step is not None and step.num_tasks > 1 and not os.environ.get("TF_CONFIG"):
        for flag, value, default in (("--workers", args.workers, None), ("--nnodes", args.nnodes, 1)):
            if value != default:
                parser.error(f"under srun, the step's {step.num_tasks} tasks are the cluster. Received: {flag} "
                             f"{value}. Drop {flag} (choose the tasks with srun -n and -N), keep --ps if you want it.")
        return run_slurm_task(step, command, args.ps)
    if args.nnodes == 1:
        if args.node_rank != 0 or args.master_addr is not None or args.node_addr is not None:
            parser.error(f"--node-rank, --master-addr and --node-addr place this machine in a job over several, but "
                         f"--nnodes is 1. Received: --node-rank {args.node_rank}, --master-addr {args.master_addr!r}, "
                         f"--node-addr {args.node_addr!r}. Pass --nnodes N on every machine, or drop them to train "
                         "on this one.")
        return run(command, workers=args.workers or 2, ps=args.ps)
    if args.node_rank >= args.nnodes:
        parser.error(f"--node-rank must be 0 to {args.nnodes - 1} (--nnodes {args.nnodes}). Received: --node-rank "
                     f"{args.node_rank}. Give each machine its own rank; node 0 serves the rendezvous.")
    if args.master_addr is None:
        parser.error(f"--nnodes {args.nnodes} needs --master-addr: node 0's address, the same on every machine. "
                     "Received: no --master-addr. Pass e.g. --master-addr node0.example.org (or its IP).")
    if args.node_addr is not None and not args.node_addr.strip():
        parser.error("--node-addr must be this machine's address as the others reach it. Received: --node-addr ''. "
                     "Pass e.g. --node-addr 10.0.0.5, or drop it to use the address that reaches node 0.")
    try:
        secret = rendezvous.read_secret(args.rdzv_secret_file)
    except ValueError as err:
        parser.error(str(err))
    return run_nodes(command, nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
                     master_port=args.master_port, workers=args.workers or 1, ps=args.ps, secret=secret,
                     node_addr=args.node_addr, timeout=float(args.rdzv_timeout))


def notebook_launcher(fn: Callable[[], Any], workers: int = 2, timeout: float | None = None) -> Any:
    """Runs `fn()` in `workers` local worker processes (one TF_CONFIG each); returns the chief's result.

    The processes are forked, so `fn` may be defined in the notebook. Fork only
    before TensorFlow has run anything in the notebook's own process: build the
    model, data and Trainer inside `fn`.
    """
    import multiprocessing

    context = multiprocessing.get_context("fork")
    cluster = cluster_spec(workers, 0, free_ports(workers))
    queue = context.Queue()
    processes = [context.Process(target=_notebook_task, args=(fn, cluster, i, queue)) for i in range(workers)]
    for p in processes:
        p.start()
    results: dict[int, Any] = {}
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while len(results) < workers:
            try:
                index, ok, value = queue.get(timeout=0.5)
            except Empty:
                dead = [i for i, p in enumerate(processes) if p.exitcode is not None and i not in results]
                if dead and queue.empty():
                    raise RuntimeError(f"worker:{dead[0]} exited (code {processes[dead[0]].exitcode}) "
                                       "without returning a result.")
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"notebook_launcher: workers still running after {timeout}s.")
                continue
            if not ok:
                raise RuntimeError(f"worker:{index} failed:\n{value}")
            results[index] = value
    finally:
        for p in processes:
            p.join(timeout=GRACE_SECONDS)
            if p.is_alive():
                p.kill()
    return results[0]


def _notebook_task(fn, cluster, index, queue) -> None:
    import pickle
    import traceback

    os.environ["TF_CONFIG"] = tf_config(cluster, "worker", index)
    os.environ[LAUNCHER_MARK] = "notebook_launcher"
    try:
        with startup_notices_hidden():  # TensorFlow's start-up notices, once per worker, stay off the page
            result = fn()
        pickle.dumps(result)  # fail here, with a message, rather than in the queue's thread
        queue.put((index, True, result))
    except BaseException:  # report any failure to the notebook, with its traceback
        queue.put((index, False, traceback.format_exc()))


if __name__ == "__main__":
    sys.exit(main())
