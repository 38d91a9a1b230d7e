"""A fault soak: a job over two workers meets random faults, and must end as if nothing had happened.

    python tests/scripts/soak.py --seed 7 --faults 20 --out /tmp/soak            # as root (the full disk is a tmpfs)
    python tests/scripts/soak.py --seed 7 --faults 20 --out /tmp/soak --slurm    # the same under a one-node Slurm

The job is soak_run.py on two workers, backing up every 4 steps. By default two `trainer-launch --nnodes 1:2
--max-restarts N` launchers on this machine play two nodes of one worker each; with --slurm it is a batch job
(`sbatch --requeue`, `srun` of two tasks) of a one-node Slurm started from Debian's packages. A schedule drawn
from the seed places faults at points of the job's progress, as many of each kind as of the others:

  kill-worker         SIGKILL of a worker
  term-worker         a preemption notice: SIGTERM of one worker (Slurm: `scontrol requeue` of the running job)
  kill-in-write       SIGKILL of the chief while it writes a backup (seen by inotify on the backup folder)
  kill-launcher       SIGKILL of a node's launcher, its machine gone (Slurm: of `srun`)
  full-disk           the backup folder's disk filled while a backup is written; freed once the chief fails
  kill-in-rendezvous  a worker killed, then, as the job starts again, a node's launcher killed while the nodes
                      meet (Slurm: a task killed while the tasks form TensorFlow's cluster)

The soak plays the cluster's scheduler: a launcher that is gone is started again a moment later (the machine
comes back) and joins at the job's next restart; a Slurm job that ends without completing is requeued. Between
faults it checks the backup: always readable, never behind the one before. At the end it compares the job
with an uninterrupted run of the same script in one process: the weights, every epoch's logged loss and
metrics, every example trained on exactly once an epoch, and the optimizer's step count (no step counted
twice or lost). It prints a report (and writes OUT/report.json): the faults survived by kind, and how long
each restart took, from the fault to the resumed job's first step. Exit status 0 when the job matches, 1
when it does not, 3 when this machine cannot run it (no tmpfs can be mounted, no Slurm).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import dataclasses
import json
import os
import random
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).resolve().parent
SCRIPT = str(SCRIPTS / "soak_run.py")
KINDS = ("kill-worker", "term-worker", "kill-in-write", "kill-launcher", "full-disk", "kill-in-rendezvous")
STEPS_PER_EPOCH, EPOCHS = 24, 4  # soak_run.py's
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS
DISK_MB = 48
# The chief's lines: "[worker:0] ..." from trainer-launch, "0: ..." from `srun --label`.
CHIEF = r"(?:\[worker:0\]|0:) "
PROGRESS = re.compile(CHIEF + r"soak-(step|begin) (\d+) (\d+)$")


@dataclasses.dataclass
class Fault:
    kind: str
    at: int  # the job's step (epoch * 24 + step) it waits for
    node: int  # the node (or Slurm task) it strikes, where it strikes one
    fired_at: int | None = None
    restart_seconds: float | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


def schedule(seed: int, faults: int, kinds: tuple[str, ...] = KINDS) -> list[Fault]:
    """`faults` faults drawn from `seed`: each of `kinds` as often as the others (one more for some), in a
    random order, at steps spread over the job's first 85%, so each can still find a backup to strike after."""
    rng = random.Random(seed)
    kinds = [kind for _ in range(faults // len(kinds)) for kind in kinds] + rng.sample(kinds, faults % len(kinds))
    rng.shuffle(kinds)
    steps = sorted(rng.randrange(2, int(TOTAL_STEPS * 0.85)) for _ in range(faults))
    return [Fault(kind, at, rng.randrange(2)) for kind, at in zip(kinds, steps)]


class SoakError(RuntimeError):
    """The job did not survive, or does not match the uninterrupted run."""


class Events:
    """Every line the job prints, timed, and what the soak reads from them."""

    def __init__(self, log: Path):
        self.lines: list[tuple[float, int, str]] = []
        self.changed = threading.Condition()
        self.log = open(log, "a")

    def add(self, source: int, line: str) -> None:
        with self.changed:
            self.lines.append((time.monotonic(), source, line))
            self.log.write(f"{time.monotonic():.3f} {source} {line}\n")
            self.log.flush()
            self.changed.notify_all()

    def wait(self, found, timeout: float, what: str, since: float = 0.0):
        """The first (time, source, line) after `since` for which `found(source, line)`, within `timeout` s."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self.changed:
            while True:
                for entry in self.lines[seen:]:
                    if entry[0] >= since and found(entry[1], entry[2]):
                        return entry
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SoakError(f"no {what} within {timeout:.0f} s")
                self.changed.wait(left)

    def position(self, since: float = 0.0) -> int:
        """The job's last step seen (epoch * 24 + step) since `since`, or -1."""
        with self.changed:
            for when, _, line in reversed(self.lines):
                if when < since:
                    break
                match = PROGRESS.match(line)
                if match:
                    return int(match[2]) * STEPS_PER_EPOCH + int(match[3])
        return -1

    def seen(self, pattern: str, since: float) -> bool:
        with self.changed:
            return any(when >= since and re.match(pattern, line) for when, _, line in self.lines)


class Launchers:
    """The job as `trainer-launch --nnodes 1:2` runs it: two launchers on this machine, as two nodes of one
    worker each. The soak plays the cluster's scheduler: a launcher that is gone is started again 1-3 s later
    (its machine comes back), and joins at the job's next restart. The job is done when node 0's launcher ends
    with status 0."""

    name = "trainer-launch --nnodes 1:2 --max-restarts N, two nodes of one worker"

    def __init__(self, soak: Soak):
        from trainer.launch.job import free_ports

        self.events, self.rng = soak.events, soak.rng
        port = free_ports(1)[0]
        self.env = {**os.environ, "TRAINER_RDZV_SECRET": f"soak-{soak.seed}", "TRAINER_BACKUP_DIR": str(soak.backup)}
        self.commands = [[sys.executable, "-m", "trainer.launch", "--nnodes", "1:2", "--node-rank", str(rank),
                          "--master-addr", "localhost", "--master-port", str(port), "--max-restarts",
                          str(4 * len(soak.faults) + 4), "--rdzv-last-call", "1", "--rdzv-timeout", "60", SCRIPT,
                          str(soak.job), str(soak.backup)] for rank in (0, 1)]
        self.cwd = soak.out
        self.procs: list[subprocess.Popen | None] = [None, None]
        self.done, self.stopping = threading.Event(), threading.Event()
        self.restarts = 0  # launchers started again
        self.problems: list[str] = []

    def start(self) -> None:
        for rank in (0, 1):
            self._launch(rank)
        threading.Thread(target=self._schedule, daemon=True).start()

    def _launch(self, rank: int) -> None:
        proc = subprocess.Popen(self.commands[rank], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env=self.env, cwd=self.cwd)
        self.procs[rank] = proc
        threading.Thread(target=self._read, args=(rank, proc), daemon=True).start()

    def _read(self, rank: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.events.add(rank, line.rstrip("\n"))

    def _schedule(self) -> None:
        due: dict[int, float] = {}
        while not self.stopping.is_set() and not self.done.is_set():
            for rank, proc in enumerate(self.procs):
                status = proc.poll()
                if status is None or (rank != 0 and status == 0):  # node 1's 0: the job ended; node 0 says so too
                    continue
                if rank == 0 and status == 0:
                    self.done.set()
                    break
                due.setdefault(rank, time.monotonic() + self.rng.uniform(1.0, 3.0))
                if time.monotonic() >= due[rank]:
                    del due[rank]
                    self._launch(rank)
                    self.restarts += 1
            time.sleep(0.1)

    def finish(self) -> None:
        """After the job: every launcher must end with status 0."""
        self.stopping.set()
        for rank, proc in enumerate(self.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
            if proc.returncode != 0:
                self.problems.append(f"node {rank}'s last launcher ended with status {proc.returncode}, not 0")

    def stop(self) -> None:
        self.stopping.set()
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.kill()

    def worker(self, rank: int) -> int | None:
        """The pid of node `rank`'s worker (its launcher's child), or None."""
        proc = self.procs[rank]
        if proc is None or proc.poll() is not None:
            return None
        children = sorted(pid for pid, parent in _processes() if parent == proc.pid)
        return children[0] if children else None

    def preempt(self, fault: Fault) -> str:
        os.kill(_worker(self, fault), signal.SIGTERM)
        return f"SIGTERM to worker {fault.node}"

    def kill_launcher(self, fault: Fault) -> str:
        self.procs[fault.node].kill()
        return f"node {fault.node}'s launcher"

    def kill_in_rendezvous(self, fault: Fault, since: float) -> str:
        """Once a node says it meets the others again after the fault at `since`, kills its launcher, 0-1.5 s in
        (node 0 waits 1 s for more nodes once one is there). The node is the one that says so: a node that came
        back waits at the rendezvous from its start, saying nothing, and may join the round before the fault's
        node can be told from it."""
        meeting = self.events.wait(lambda source, line: "meeting at the rendezvous" in line, 120,
                                   "a node meeting the others", since=since)
        rank = fault.node = meeting[1]
        time.sleep(self.rng.uniform(0.0, 1.5))
        self.procs[rank].kill()
        return f"node {rank}'s launcher killed {time.monotonic() - meeting[0]:.2f} s into the rendezvous"


class SlurmJob:
    """The job as a Slurm batch job runs it (`sbatch --requeue`, `srun --kill-on-bad-exit=1` of two tasks) on
    a one-node Slurm of this machine (slurm_cluster.py). The soak follows the job's log, which each run of it
    appends to, and requeues a job that ended without completing (`scontrol requeue`, started at once), as a
    site's automation does. The job is done when Slurm says COMPLETED."""

    name = "a Slurm batch job (sbatch --requeue, srun of two tasks), requeued"

    def __init__(self, soak: Soak):
        sys.path.insert(0, str(SCRIPTS.parent / "helpers"))
        import slurm_cluster

        missing = slurm_cluster.missing()
        if missing:
            raise PermissionError(f"Slurm is not installed here (no {', '.join(missing)}): {slurm_cluster.PACKAGES}")
        self.events, self.rng, self.cwd = soak.events, soak.rng, soak.out
        folder = soak.out / "slurm"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # munged refuses a key folder others can write
        self.slurm = slurm_cluster.Slurm(folder)
        self.log = soak.out / "job.out"
        self.script = soak.out / "job.sbatch"
        self.script.write_text("\n".join([
            "#!/bin/bash", "#SBATCH --ntasks=2", "#SBATCH --requeue", "#SBATCH --open-mode=append",
            f"#SBATCH --output={self.log}", "echo soak-job-start",
            f"srun --label --kill-on-bad-exit=1 {sys.executable} {SCRIPT} {soak.job} {soak.backup}", ""]))
        self.id: str | None = None
        self.done, self.stopping = threading.Event(), threading.Event()
        self.restarts = 0  # requeues
        self.problems: list[str] = []

    def start(self) -> None:
        self.slurm.start()
        submitted = self._run("sbatch", "--parsable", str(self.script))
        if not submitted:
            raise SoakError("sbatch did not take the job")
        self.id = submitted.split(";")[0].strip()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._schedule, daemon=True).start()

    def _run(self, *command: str) -> str:
        done = subprocess.run(command, capture_output=True, text=True, env=self.slurm.env, cwd=self.cwd)
        return done.stdout if done.returncode == 0 else ""

    def _read(self) -> None:
        """Follows the job's log."""
        while not self.log.exists() and not self.stopping.is_set():
            time.sleep(0.05)
        with open(self.log) as f:
            partial = ""
            while not self.stopping.is_set():
                partial += f.readline()
                if partial.endswith("\n"):
                    self.events.add(0, partial.rstrip("\n"))
                    partial = ""
                else:
                    time.sleep(0.02)

    def _state(self) -> dict[str, str]:
        text = self._run("scontrol", "show", "job", "-o", self.id)
        return dict(field.split("=", 1) for field in text.split() if "=" in field)

    def _schedule(self) -> None:
        while not self.stopping.is_set():
            state = self._state()
            status = state.get("JobState", "")
            if status == "COMPLETED":
                self.done.set()
                return
            if status in ("FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "PREEMPTED"):
                self._run("scontrol", "requeue", self.id)
                self.restarts += 1
            elif status == "PENDING" and state.get("Reason") == "BeginTime":  # Slurm holds a requeued job 2 min
                self._run("scontrol", "update", f"JobId={self.id}", "StartTime=now")
            time.sleep(0.3)

    def finish(self) -> None:
        self.stopping.set()

    def stop(self) -> None:
        self.stopping.set()
        if self.id is not None and self._state().get("JobState") in ("RUNNING", "PENDING"):
            self._run("scancel", self.id)
        self.slurm.stop()

    def worker(self, rank: int) -> int | None:
        """The pid of the running job's task `rank`, or None."""
        for pid, argv in _commands():
            if SCRIPT in argv and not argv[0].endswith("srun"):
                with contextlib.suppress(OSError):
                    with open(f"/proc/{pid}/environ", "rb") as f:
                        if f"SLURM_PROCID={rank}".encode() in f.read().split(b"\0"):
                            return pid
        return None

    def preempt(self, fault: Fault) -> str:
        self._run("scontrol", "requeue", self.id)  # what a preemption does: SIGTERM to every task, queued again
        return "scontrol requeue of the running job"

    def kill_launcher(self, fault: Fault) -> str:
        for pid, argv in _commands():
            if argv[0].endswith("srun") and SCRIPT in argv:
                os.kill(pid, signal.SIGKILL)
        return "srun"

    def kill_in_rendezvous(self, fault: Fault, since: float) -> str:
        """Once the job runs again after the fault at `since`, kills a task while the tasks form TensorFlow's
        cluster: 0-0.5 s after its server listens, before training begins."""
        started = self.events.wait(lambda source, line: line == "soak-job-start", 300, "the job's next run",
                                   since=since)[0]
        deadline = time.monotonic() + 120
        while (pid := self.worker(fault.node)) is None or not _listens(pid):
            if time.monotonic() > deadline:
                raise SoakError(f"task {fault.node}'s server never listened after the requeue")
            time.sleep(0.02)
        time.sleep(self.rng.uniform(0.0, 0.5))
        os.kill(pid, signal.SIGKILL)
        began = self.events.seen(CHIEF + "soak-begin", started)
        return (f"task {fault.node} killed {time.monotonic() - started:.1f} s after the job started, its server "
                f"up, {'after' if began else 'before'} training began")


def _worker(job, fault: Fault) -> int:
    """The pid of the worker the fault strikes: its node's, or the other's if that has none now."""
    for rank in (fault.node, 1 - fault.node):
        pid = job.worker(rank)
        if pid is not None:
            fault.node = rank
            return pid
    raise SoakError("no worker is running")


def _processes():
    """(pid, parent pid) of every live process."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if fields[0] != "Z":
                    yield int(entry), int(fields[1])


def _listens(pid: int) -> bool:
    """Whether the process has a listening TCP socket (its TensorFlow server is up)."""
    with contextlib.suppress(OSError):
        sockets = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as f:
                for row in f.readlines()[1:]:
                    fields = row.split()
                    if fields[3] == "0A" and f"socket:[{fields[9]}]" in sockets:  # 0A: LISTEN
                        return True
    return False


def _commands():
    """(pid, argv) of every live process."""
    for pid, _ in _processes():
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = [arg.decode(errors="replace") for arg in f.read().split(b"\0")]
            yield pid, argv


class Disk:
    """A small tmpfs for the backups, which the full-disk fault fills."""

    def __init__(self, where: Path):
        self.where = where
        self.filler = where / "filler"
        self._keeper: tuple[threading.Event, threading.Thread] | None = None

    def mount(self) -> None:
        self.where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(self.where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise PermissionError(f"mount -t tmpfs failed ({done.stderr.strip()}): run the soak as root")

    def fill(self, leave: int) -> None:
        """Fills the disk but for `leave` bytes, and keeps it so until `free()`: a backup whose write began
        before the fill, and fitted, frees the one it replaces, and the next write must meet a full disk too."""
        f = open(self.filler, "wb", buffering=0)
        self._top_up(f, leave)
        stop = threading.Event()
        self._keeper = stop, threading.Thread(target=self._keep, args=(f, leave, stop), daemon=True)
        self._keeper[1].start()

    def _keep(self, f, leave: int, stop: threading.Event) -> None:
        with f:
            while not stop.wait(0.01):
                self._top_up(f, leave)

    def _top_up(self, f, leave: int) -> None:
        stats = os.statvfs(self.where)
        extra = stats.f_bavail * stats.f_frsize - leave
        with contextlib.suppress(OSError):  # ENOSPC: the job's write took the space first
            while extra > 0:
                extra -= f.write(b"\0" * min(extra, 1 << 20))

    def free(self) -> None:
        if self._keeper is not None:
            stop, thread = self._keeper
            stop.set()
            thread.join()
            self._keeper = None
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.filler)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.where)], capture_output=True)


class Created:
    """The names created in a folder from now on (Linux inotify, IN_CREATE)."""

    def __init__(self, folder: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, str(folder).encode(), 0x100) < 0:
            raise OSError(ctypes.get_errno(), f"inotify on {folder}")

    def wait(self, prefix: str, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not select.select([self.fd], [], [], left)[0]:
                break
            data = os.read(self.fd, 65536)
            while data:
                _, _, _, length = struct.unpack("iIII", data[:16])
                name = data[16:16 + length].rstrip(b"\0").decode()
                data = data[16 + length:]
                if name.startswith(prefix):
                    return name
        return None

    def close(self) -> None:
        os.close(self.fd)


class Soak:
    def __init__(self, out: Path, seed: int, faults: int, kinds: tuple[str, ...] = KINDS, slurm: bool = False):
        self.out, self.seed, self.slurm = out, seed, slurm
        self.faults = schedule(seed, faults, kinds)
        self.rng = random.Random(seed + 1)
        self.disk = Disk(out / "disk")
        self.backup = self.disk.where / "backup"
        self.job = out / "job"
        self.events = Events(out / "job.log")
        self.backups_seen: list[tuple[int, int]] = []
        self.training_since = 0.0  # when the job last started training again: its progress counts from there
        self.problems: list[str] = []

    # The run -----------------------------------------------------------------------------------------

    def run(self) -> dict:
        self.disk.mount()
        try:
            reference = self._reference()
            started = time.monotonic()
            job = self._run_job()
            took = time.monotonic() - started
            self._compare(reference)
        finally:
            self.disk.unmount()
        return self._report(job, took)

    def _reference(self) -> Path:
        where = self.out / "reference"
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, SCRIPT, str(where), str(where / "backup")], capture_output=True,
                              text=True, timeout=600)
        if done.returncode != 0:
            raise SoakError(f"the uninterrupted run failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return where

    def _run_job(self) -> Launchers | SlurmJob:
        self.job.mkdir(parents=True, exist_ok=True)
        self.backup.mkdir(parents=True, exist_ok=True)
        job = SlurmJob(self) if self.slurm else Launchers(self)
        try:
            job.start()
            for fault in self.faults:
                self._fire(fault, job)
            if not job.done.wait(600):
                raise SoakError("the job did not end within 600 s of the last fault")
            job.finish()
        finally:
            job.stop()
        self.problems += job.problems
        left = [pid for pid, argv in _commands() if str(self.job) in argv]
        if left:
            self.problems.append(f"processes left running after the job: {left}")
        return job

    # Faults ------------------------------------------------------------------------------------------

    def _fire(self, fault: Fault, job) -> None:
        """Waits for the job to reach the fault's step, strikes, and waits for the job to train again."""
        self.events.wait(lambda source, line: (m := PROGRESS.match(line)) is not None and m[1] == "step"
                         and int(m[2]) * STEPS_PER_EPOCH + int(m[3]) >= fault.at, 600, f"step {fault.at}",
                         since=self.training_since)
        fired = time.monotonic()
        fault.fired_at = self.events.position(since=self.training_since)
        getattr(self, "_" + fault.kind.replace("-", "_"))(fault, job)
        try:
            begin = self.events.wait(lambda source, line: re.match(CHIEF + "soak-begin", line), 300,
                                     "resumed job", since=fired)
            step = self.events.wait(lambda source, line: re.match(CHIEF + "soak-step", line), 120,
                                    "step after the resume", since=begin[0])
        except SoakError:
            if not (self.job / "result.npz").exists():
                raise
            fault.notes.append("the job ended before a restart")  # struck after the last backup
        else:
            fault.restart_seconds = round(step[0] - fired, 2)
            self.training_since = step[0]
        self._check_backup(fault)

    def _kill_worker(self, fault: Fault, job) -> None:
        os.kill(_worker(job, fault), signal.SIGKILL)

    def _term_worker(self, fault: Fault, job) -> None:
        fired = time.monotonic()
        fault.notes.append(job.preempt(fault))
        with contextlib.suppress(SoakError):
            saved = self.events.wait(lambda source, line: "BackupAndRestore: SIGTERM received" in line, 60,
                                     "SIGTERM backup", since=fired)
            fault.notes.append(saved[2].split("; ", 1)[1].split(". ")[0])  # "backup saved at epoch E, step S"

    def _kill_in_write(self, fault: Fault, job) -> None:
        fault.node = 0  # the chief writes the backups
        created = Created(self.backup)
        try:
            name = created.wait(".backup.npz.tmp-", 120)
            if name is None:
                raise SoakError("no backup was written within 120 s")
            os.kill(_worker(job, fault), signal.SIGKILL)
        finally:
            created.close()
        time.sleep(0.2)
        if (self.backup / name).exists():
            fault.notes.append("killed mid-write: a torn temporary file was left")
        else:
            fault.kind = "kill-after-write"
            fault.notes.append("killed just after the write")

    def _kill_launcher(self, fault: Fault, job) -> None:
        fault.notes.append("killed " + job.kill_launcher(fault))

    def _full_disk(self, fault: Fault, job) -> None:
        fired = time.monotonic()
        fault.node = 0
        backup = self.backup / "backup.npz"
        self.disk.fill(leave=(backup.stat().st_size if backup.exists() else 5_000_000) // 3)
        try:
            failed = self.events.wait(lambda source, line: "could not write" in line and "No space left" in line,
                                      120, "chief's full-disk error", since=fired)
            intact = "is intact" in failed[2] or "No earlier backup was written" in failed[2]
            fault.notes.append("the chief named the full disk" + (" and the intact backup" if intact else ""))
            if not intact:
                self.problems.append(f"full disk: the chief's error does not say what is intact: {failed[2]}")
        finally:
            self.disk.free()  # the operator frees space; the restarted job backs up again

    def _kill_in_rendezvous(self, fault: Fault, job) -> None:
        fired = time.monotonic()
        os.kill(_worker(job, Fault("kill-worker", fault.at, self.rng.randrange(2))), signal.SIGKILL)
        fault.notes.append(job.kill_in_rendezvous(fault, since=fired))

    # Checks ------------------------------------------------------------------------------------------

    def _check_backup(self, fault: Fault) -> None:
        """The backup is readable and not behind the one before."""
        path = self.backup / "backup.npz"
        if not path.exists():
            return
        try:
            with np.load(path) as backup:
                arrays = {key: backup[key] for key in backup.files}
            state = json.loads(str(arrays["state"]))
        except Exception as err:  # noqa: BLE001 - any failure to read is the finding
            self.problems.append(f"after {fault.kind}: the backup is unreadable ({type(err).__name__}: {err})")
            return
        position = (state["epoch"], state["step"])
        if self.backups_seen and position < self.backups_seen[-1]:
            self.problems.append(f"after {fault.kind}: the backup went back from {self.backups_seen[-1]} to "
                                 f"{position}")
        self.backups_seen.append(position)

    def _compare(self, reference: Path) -> None:
        if not (self.job / "result.npz").exists():
            raise SoakError("the job ended without its result")
        with np.load(self.job / "result.npz") as got, np.load(reference / "result.npz") as want:
            got, want = dict(got), dict(want)
        if not np.array_equal(got["counts"], np.full(len(got["counts"]), float(EPOCHS))):
            counts = collections.Counter(got["counts"].tolist())
            self.problems.append(f"examples trained on other than {EPOCHS} times: {dict(counts)}")
        if int(got["iterations"]) != TOTAL_STEPS:
            self.problems.append(f"the optimizer counted {int(got['iterations'])} steps, not {TOTAL_STEPS}")
        for key in sorted(k for k in want if k.startswith("weight_")):
            if not np.allclose(got[key], want[key], rtol=1e-5, atol=1e-6):
                self.problems.append(f"{key} differs from the uninterrupted run's by up to "
                                     f"{np.max(np.abs(got[key] - want[key])):.2e}")
        rows, expected = _log(self.job), _log(reference)
        if [sorted(r) for r in rows] != [sorted(r) for r in expected]:
            self.problems.append(f"the log's epochs or keys differ: {[sorted(r) for r in rows]}")
        for row, want_row in zip(rows, expected):
            for key, value in want_row.items():
                if key in row and not np.isclose(row[key], value, rtol=1e-5, atol=1e-7):
                    self.problems.append(f"epoch {row['epoch']}'s {key}: {row[key]} (uninterrupted: {value})")
        left = sorted(p.name for p in self.backup.iterdir())
        if left:  # the backup goes when training completes, and each write removes what a killed one left
            self.problems.append(f"files left in the backup folder after training completed: {left}")

    def _report(self, job, took: float) -> dict:
        by_kind: dict[str, list[Fault]] = collections.defaultdict(list)
        for fault in self.faults:
            by_kind[fault.kind].append(fault)
        report = {
            "seed": self.seed, "job": job.name, "fault_count": len(self.faults), "job_seconds": round(took, 1),
            "restarts": job.restarts, "matches_uninterrupted": not self.problems, "problems": self.problems,
            "by_kind": {kind: {"count": len(faults), "restart_seconds": sorted(
                f.restart_seconds for f in faults if f.restart_seconds is not None)}
                for kind, faults in sorted(by_kind.items())},
            "faults": [dataclasses.asdict(f) for f in self.faults],
        }
        (self.out / "report.json").write_text(json.dumps(report, indent=1))
        return report


def _log(where: Path) -> list[dict]:
    with open(where / "log.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in row.items() if k not in ("epoch_time", "examples_per_second")} for row in rows]


def _print(report: dict) -> None:
    print(f"soak: {report['job']}; seed {report['seed']}, {report['fault_count']} faults; the job took "
          f"{report['job_seconds']} s ({report['restarts']} launchers or jobs started again by the soak)")
    print(f"  {'fault':<20} {'count':>5}  restart seconds (fault to the resumed job's first step)")
    for kind, row in report["by_kind"].items():
        seconds = ", ".join(f"{s:.1f}" for s in row["restart_seconds"]) or "-"
        print(f"  {kind:<20} {row['count']:>5}  {seconds}")
    for fault in report["faults"]:
        print(f"  step {fault['at']:>3} -> {fault['fired_at']:>3}  {fault['kind']:<20} {fault['node']}  "
              f"{'; '.join(fault['notes'])}")
    print("matches the uninterrupted run: weights, logged epochs, example counts, steps" if
          report["matches_uninterrupted"] else "DOES NOT MATCH:\n  " + "\n  ".join(report["problems"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="draws the schedule (default 0)")
    parser.add_argument("--faults", type=int, default=6, help="faults to draw (default 6: one of each kind)")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the kinds to draw, comma-separated (default: all)")
    parser.add_argument("--slurm", action="store_true", help="run the job as a requeued Slurm batch job")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the runs, logs and report")
    parser.add_argument("--data", choices=("arrays", "reshuffled"), default="arrays",
                        help="what the job trains on: arrays, or a tf.data pipeline that reshuffles each pass")
    args = parser.parse_args(argv)
    os.environ["SOAK_DATA"] = args.data  # soak_run.py's, in the job's tasks and the reference run alike
    if args.faults < 1:
        parser.error(f"--faults must be at least 1. Received: --faults {args.faults}.")
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kinds must name kinds of {', '.join(KINDS)}. Received: --kinds {args.kinds!r}.")
    args.out.mkdir(parents=True, exist_ok=True)
    soak = Soak(args.out.resolve(), args.seed, args.faults, kinds, slurm=args.slurm)
    try:
        report = soak.run()
    except PermissionError as err:
        print(f"soak: {err}", file=sys.stderr)
        return 3
    except SoakError as err:
        print(f"soak: FAILED: {err} (the job's lines: {soak.out / 'job.log'})", file=sys.stderr)
        return 1
    _print(report)
    return 0 if report["matches_uninterrupted"] else 1


if __name__ == "__main__":
    sys.exit(main())
