"""One machine's tasks of a job: their processes, their output, and the loop that watches them.

`run_tasks` starts this machine's tasks of a cluster (each with its TF_CONFIG
and an output prefix), then waits for the script's end, a failed task, a stop
request (Ctrl-C, SIGTERM) or a stop from another node (the `link` of
`links.py`), and stops the rest: SIGTERM first (time to save a backup), then
SIGKILL. `job.py` decides what a job is and whether it starts again.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

from trainer.distribute import gpus
from trainer.distribute.cluster import LAUNCHER_MARK
from trainer.launch import links
from trainer.quiet import NoticeFilter, user_chose_logs

GRACE_SECONDS = 10.0  # between SIGTERM (time to save a backup) and SIGKILL


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


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def run_tasks(command, cluster: dict[str, list[str]], own: list[tuple[str, int]], *, origin: str,
              env: dict[str, str] | None = None, out=None, server_command=None, link=None,
              requested: list[int] | None = None, gpu_shares: list[list[str]] | None = None) -> int:
    """Runs this machine's tasks `own` of `cluster` and supervises them; returns the exit status. With
    `gpu_shares`, this machine's worker tasks, in order, each see theirs (CUDA_VISIBLE_DEVICES), and its
    chief and ps tasks of a parameter-server cluster none."""
    out = out or sys.stdout
    link = link or links.Alone()
    base_env = {**(os.environ if env is None else env), LAUNCHER_MARK: origin}
    with contextlib.ExitStack() as stack:
        if requested is None:
            requested = stack.enter_context(stop_requests())
        running = _start_tasks(cluster, own, command, server_command or _server_command, base_env, out, requested,
                               gpu_shares)
        with_ps = "ps" in cluster
        script_tasks = [t for t in running if not with_ps or t.name == "chief:0"]
        return _supervise(running, out, script_tasks, requested, link)


def _start_tasks(cluster, own, command, server_command, base_env, out, requested: list[int],
                 gpu_shares: list[list[str]] | None = None) -> list[_Task]:
    """Starts this machine's tasks (until a stop is requested); if one can't start, stops those that did."""
    with_ps = "ps" in cluster
    running: list[_Task] = []
    local_workers = [task for task in own if task[0] == "worker"]
    try:
        for kind, index in own:
            if requested:
                break
            task_env = {**base_env, "TF_CONFIG": tf_config(cluster, kind, index)}
            if gpu_shares is not None:
                share = gpu_shares[local_workers.index((kind, index))] if kind == "worker" else []
                task_env[gpus.VISIBLE] = gpus.visible(share)
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
def stop_requests():
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
            say(out, "interrupted; stopping every task")
            link.stopping(status, "interrupted", leaving=True)
        elif failed is not None:
            status, stopping = _exit_status(failed.process.returncode), [t for t in running if t is not failed]
            why = _ended(failed.name, status)
            say(out, f"{why}; stopping the others")
            link.stopping(status, why)
        elif news is not None:
            (status, why), stopping = news, running
            if status != 0:
                say(out, f"{why}; stopping every task here")
        elif script_tasks and all(t.process.poll() == 0 for t in script_tasks):
            status, stopping = 0, [t for t in running if t not in script_tasks]  # servers run until told to stop
        else:
            time.sleep(0.1)
            continue
        _stop(stopping)
        for task in running:  # let every task's last lines through
            task.pump.join(timeout=5)
        return link.finish(status)


def _ended(name: str, status: int) -> str:
    """How a task ended, in the launcher's words: a task stopped by SIGTERM or SIGINT from outside (a
    preempted node, where a backup callback may have saved first) was stopped, not failed."""
    if status - 128 in (signal.SIGTERM, signal.SIGINT):
        return f"task {name} was stopped by {signal.Signals(status - 128).name} (exit status {status})"
    return f"task {name} failed with exit status {status}"


def say(out, message: str) -> None:
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
