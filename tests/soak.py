"""A fault soak: a job over two nodes meets random faults, and must end as if nothing had happened.

    python tests/soak.py --seed 7 --faults 20 --out /tmp/soak        # as root (the full disk is a tmpfs)

Two `trainer-launch --nnodes 1:2 --max-restarts N` launchers on this machine play two nodes of one worker
each (soak_run.py is the job, backing up every 4 steps). A schedule drawn from the seed places the faults at
points of the job's progress, each of these kinds, in turn:

  kill-worker         SIGKILL of a node's worker
  term-worker         SIGTERM of a node's worker (a preemption notice)
  kill-in-write       SIGKILL of the chief while it writes a backup (seen by inotify on the backup folder)
  kill-launcher       SIGKILL of a node's launcher (its machine gone)
  full-disk           the backup folder's disk filled while a backup is written; freed once the chief fails
  kill-in-rendezvous  a worker killed, then a node's launcher killed while the nodes meet again

The soak plays the cluster's scheduler: a launcher that is gone is started again a moment later (the machine
comes back), and it joins the job at its next restart. Between faults it checks the backup: always readable,
never behind the one before. At the end it compares the job with an uninterrupted run of the same script in
one process: the weights, every epoch's logged loss and metrics, every example trained on exactly once an
epoch and the optimizer's step count (no step counted twice or lost). It prints a report (and writes
OUT/report.json): the faults survived, by kind, and how long each restart took, from the fault to the first
step of the resumed job. Exit status 0 when the job matches, 1 when it does not, 3 when no tmpfs can be
mounted for the full disk.
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

TESTS = Path(__file__).resolve().parent
SCRIPT = str(TESTS / "soak_run.py")
KINDS = ("kill-worker", "term-worker", "kill-in-write", "kill-launcher", "full-disk", "kill-in-rendezvous")
STEPS_PER_EPOCH, EPOCHS = 24, 4  # soak_run.py's
TOTAL_STEPS = STEPS_PER_EPOCH * EPOCHS
DISK_MB = 48
PROGRESS = re.compile(r"^\[worker:0\] soak-(step|begin) (\d+) (\d+)$")


@dataclasses.dataclass
class Fault:
    kind: str
    at: int  # the job's step (epoch * 24 + step) it waits for
    node: int  # the node it strikes, where it strikes one
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


class Events:
    """Every line the launchers print, timed, and what the soak reads from them."""

    def __init__(self, log: Path):
        self.lines: list[tuple[float, int, str]] = []
        self.changed = threading.Condition()
        self.log = open(log, "a")

    def add(self, node: int, line: str) -> None:
        with self.changed:
            self.lines.append((time.monotonic(), node, line))
            self.log.write(f"{time.monotonic():.3f} node{node} {line}\n")
            self.log.flush()
            self.changed.notify_all()

    def wait(self, found, timeout: float, what: str, since: float = 0.0):
        """The first (time, node, line) after `since` for which `found(node, line)`, within `timeout` seconds."""
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


class SoakError(RuntimeError):
    """The job did not survive, or does not match the uninterrupted run."""


class Node:
    """One node's launcher, started again by the soak's scheduler whenever it is gone."""

    def __init__(self, rank: int, command: list[str], env: dict, cwd: Path, events: Events):
        self.rank, self.command, self.env, self.cwd, self.events = rank, command, env, cwd, events
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=self.env, cwd=self.cwd)
        self.starts += 1
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc) -> None:
        for line in proc.stdout:
            self.events.add(self.rank, line.rstrip("\n"))

    def worker(self) -> int | None:
        """The pid of this node's worker (the launcher's child), or None."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        children = _children(self.proc.pid)
        return children[0] if children else None


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    found.append(int(entry))
    return sorted(found)


class Scheduler(threading.Thread):
    """Starts a node's launcher again 1-3 s after it is gone, until node 0's launcher ends the job (status 0)."""

    def __init__(self, nodes: list[Node], rng: random.Random):
        super().__init__(daemon=True)
        self.nodes, self.rng = nodes, rng
        self.done = threading.Event()
        self.stopping = threading.Event()
        self.relaunches = 0

    def run(self) -> None:
        due: dict[int, float] = {}
        while not self.stopping.is_set():
            for node in self.nodes:
                status = node.proc.poll()
                if status is None or self.done.is_set():
                    continue
                if node.rank == 0 and status == 0:
                    self.done.set()
                    continue
                if node.rank != 0 and status == 0:
                    continue  # its round ended the job; node 0 says so too
                due.setdefault(node.rank, time.monotonic() + self.rng.uniform(1.0, 3.0))
                if time.monotonic() >= due[node.rank]:
                    del due[node.rank]
                    node.start()
                    self.relaunches += 1
            time.sleep(0.1)


class Disk:
    """A small tmpfs for the backups, which the full-disk fault fills."""

    def __init__(self, where: Path):
        self.where = where
        self.filler = where / "filler"

    def mount(self) -> None:
        self.where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(self.where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise PermissionError(f"mount -t tmpfs failed ({done.stderr.strip()}): run the soak as root")

    def fill(self, leave: int) -> None:
        """Fills the disk until `leave` bytes are free."""
        stat = os.statvfs(self.where)
        size = stat.f_bavail * stat.f_frsize - leave
        with open(self.filler, "wb") as f:
            f.write(b"\0" * max(0, size))

    def free(self) -> None:
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
    def __init__(self, out: Path, seed: int, faults: int, kinds: tuple[str, ...] = KINDS):
        self.out, self.seed = out, seed
        self.faults = schedule(seed, faults, kinds)
        self.rng = random.Random(seed + 1)
        self.disk = Disk(out / "disk")
        self.backup = self.disk.where / "backup"
        self.job = out / "job"
        self.events: Events | None = None
        self.backups_seen: list[tuple[int, int]] = []
        self.training_since = 0.0  # when the job last started training again: its progress counts from there
        self.problems: list[str] = []

    # The run -----------------------------------------------------------------------------------------

    def run(self) -> dict:
        self.disk.mount()
        try:
            reference = self._reference()
            started = time.monotonic()
            self._job()
            took = time.monotonic() - started
            self._compare(reference)
        finally:
            self.disk.unmount()
        return self._report(took)

    def _reference(self) -> Path:
        where = self.out / "reference"
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, SCRIPT, str(where), str(where / "backup")], capture_output=True,
                              text=True, env=_env(), timeout=600)
        if done.returncode != 0:
            raise SoakError(f"the uninterrupted run failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        return where

    def _job(self) -> None:
        self.job.mkdir(parents=True, exist_ok=True)
        self.backup.mkdir(parents=True, exist_ok=True)
        self.events = Events(self.out / "launchers.log")
        from trainer.launch.launcher import free_ports

        port = free_ports(1)[0]
        env = {**_env(), "TRAINER_RDZV_SECRET": f"soak-{self.seed}", "TRAINER_BACKUP_DIR": str(self.backup)}
        nodes = [Node(rank, [sys.executable, "-m", "trainer.launch", "--nnodes", "1:2", "--node-rank", str(rank),
                             "--master-addr", "localhost", "--master-port", str(port), "--max-restarts",
                             str(4 * len(self.faults) + 4), "--rdzv-last-call", "1", "--rdzv-timeout", "60", SCRIPT,
                             str(self.job), str(self.backup)], env, self.out, self.events) for rank in (0, 1)]
        for node in nodes:
            node.start()
        scheduler = Scheduler(nodes, self.rng)
        scheduler.start()
        try:
            for fault in self.faults:
                self._fire(fault, nodes)
            if not scheduler.done.wait(600):
                raise SoakError("the job did not end within 600 s of the last fault")
            for node in nodes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=60)
                if node.proc.returncode != 0:
                    self.problems.append(f"node {node.rank}'s last launcher ended with status "
                                         f"{node.proc.returncode}, not 0")
        finally:
            scheduler.stopping.set()
            for node in nodes:
                if node.proc.poll() is None:
                    node.proc.kill()
        self.relaunches = scheduler.relaunches
        left = subprocess.run(["pgrep", "-f", str(self.job)], capture_output=True, text=True).stdout.split()
        if left:
            self.problems.append(f"processes left running after the job: {left}")

    # Faults ------------------------------------------------------------------------------------------

    def _fire(self, fault: Fault, nodes: list[Node]) -> None:
        """Waits for the job to reach the fault's step, strikes, and waits for the job to train again."""
        self.events.wait(lambda node, line: (m := PROGRESS.match(line)) is not None and m[1] == "step"
                         and int(m[2]) * STEPS_PER_EPOCH + int(m[3]) >= fault.at, 600, f"step {fault.at}",
                         since=self.training_since)
        fired = time.monotonic()
        fault.fired_at = self.events.position(since=self.training_since)
        getattr(self, "_" + fault.kind.replace("-", "_"))(fault, nodes)
        try:
            begin = self.events.wait(lambda node, line: line.startswith("[worker:0] soak-begin"), 300,
                                     "resumed job", since=fired)
            step = self.events.wait(lambda node, line: line.startswith("[worker:0] soak-step"), 120,
                                    "step after the resume", since=begin[0])
        except SoakError:
            if not (self.job / "result.npz").exists():
                raise
            fault.notes.append("the job ended before a restart")  # struck after the last backup
        else:
            fault.restart_seconds = round(step[0] - fired, 2)
            self.training_since = step[0]
        self._check_backup(fault)

    @staticmethod
    def _worker(nodes: list[Node], rank: int, fault: Fault | None = None) -> int:
        """The pid of node `rank`'s worker, or of the other node's if `rank` has none now (the fault's node)."""
        for node in (nodes[rank], nodes[1 - rank]):
            pid = node.worker()
            if pid is not None:
                if fault is not None:
                    fault.node = node.rank
                return pid
        raise SoakError("no worker is running on either node")

    def _kill_worker(self, fault: Fault, nodes: list[Node]) -> None:
        os.kill(self._worker(nodes, fault.node, fault), signal.SIGKILL)

    def _term_worker(self, fault: Fault, nodes: list[Node]) -> None:
        fired = time.monotonic()
        os.kill(self._worker(nodes, fault.node, fault), signal.SIGTERM)
        with contextlib.suppress(SoakError):
            saved = self.events.wait(lambda node, line: "BackupAndRestore: SIGTERM received" in line, 60,
                                     "SIGTERM backup", since=fired)
            fault.notes.append(saved[2].split("; ", 1)[1].split(". ")[0])  # "backup saved at epoch E, step S"

    def _kill_in_write(self, fault: Fault, nodes: list[Node]) -> None:
        created = Created(self.backup)
        try:
            name = created.wait(".backup.npz.tmp-", 120)
            if name is None:
                raise SoakError("no backup was written within 120 s")
            os.kill(self._worker(nodes, 0, fault), signal.SIGKILL)  # worker 0, the chief, writes the backups
        finally:
            created.close()
        time.sleep(0.2)
        torn = (self.backup / name).exists()
        fault.notes.append("killed mid-write: a torn temporary file was left" if torn else
                           "killed just after the write")
        if not torn:
            fault.kind = "kill-after-write"

    def _kill_launcher(self, fault: Fault, nodes: list[Node]) -> None:
        nodes[fault.node].proc.kill()

    def _full_disk(self, fault: Fault, nodes: list[Node]) -> None:
        fired = time.monotonic()
        fault.node = 0  # the chief's node: it writes the backups
        backup = self.backup / "backup.npz"
        size = backup.stat().st_size if backup.exists() else 5_000_000
        self.disk.fill(leave=size // 3)
        try:
            failed = self.events.wait(lambda node, line: "could not write" in line and "No space left" in line, 120,
                                      "chief's full-disk error", since=fired)
            intact = "is intact" in failed[2] or "No earlier backup was written" in failed[2]
            fault.notes.append("the chief named the full disk" + (" and the intact backup" if intact else ""))
            if not intact:
                self.problems.append(f"full disk: the chief's error does not say what is intact: {failed[2]}")
        finally:
            self.disk.free()  # the operator frees space; the restarted job backs up again

    def _kill_in_rendezvous(self, fault: Fault, nodes: list[Node]) -> None:
        fired = time.monotonic()
        # The victim meets the others: a node of this round (one that came back waits from its start).
        victim = nodes[fault.node] if nodes[fault.node].worker() is not None else nodes[1 - fault.node]
        fault.node = victim.rank
        os.kill(self._worker(nodes, self.rng.randrange(2)), signal.SIGKILL)
        meeting = self.events.wait(lambda node, line: node == victim.rank and "meeting at the rendezvous" in line,
                                   120, f"node {victim.rank} meeting the others", since=fired)
        time.sleep(self.rng.uniform(0.0, 1.5))  # node 0 waits 1 s for more nodes once one is there
        victim.proc.kill()
        fault.notes.append(f"node {victim.rank}'s launcher killed {time.monotonic() - meeting[0]:.2f} s into the "
                           "rendezvous")

    # Checks ------------------------------------------------------------------------------------------

    def _check_backup(self, fault: Fault) -> None:
        """The backup is readable and not behind the one before."""
        path = self.backup / "backup.npz"
        if path.exists():
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

    def _report(self, took: float) -> dict:
        by_kind: dict[str, list[Fault]] = collections.defaultdict(list)
        for fault in self.faults:
            by_kind[fault.kind].append(fault)
        report = {
            "seed": self.seed, "fault_count": len(self.faults), "job_seconds": round(took, 1),
            "launcher_restarts": self.relaunches, "matches_uninterrupted": not self.problems,
            "problems": self.problems, "by_kind": {
                kind: {"count": len(faults),
                       "restart_seconds": sorted(f.restart_seconds for f in faults if f.restart_seconds is not None)}
                for kind, faults in sorted(by_kind.items())},
            "faults": [dataclasses.asdict(f) for f in self.faults],
        }
        (self.out / "report.json").write_text(json.dumps(report, indent=1))
        return report


def _env() -> dict:
    """This process's environment: the launchers keep TensorFlow's start-up notices off the log."""
    return dict(os.environ)


def _log(where: Path) -> list[dict]:
    with open(where / "log.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in row.items() if k not in ("epoch_time", "examples_per_second")} for row in rows]


def _print(report: dict) -> None:
    print(f"soak: seed {report['seed']}, {report['fault_count']} faults, the job took {report['job_seconds']} s "
          f"({report['launcher_restarts']} launchers started again)")
    print(f"  {'fault':<20} {'count':>5}  restart seconds (fault to the resumed job's first step)")
    for kind, row in report["by_kind"].items():
        seconds = ", ".join(f"{s:.1f}" for s in row["restart_seconds"]) or "-"
        print(f"  {kind:<20} {row['count']:>5}  {seconds}")
    for fault in report["faults"]:
        print(f"  step {fault['at']:>3} -> {fault['fired_at']:>3}  {fault['kind']:<20} node {fault['node']}  "
              f"{'; '.join(fault['notes'])}")
    print("matches the uninterrupted run: weights, logged epochs, example counts, steps" if
          report["matches_uninterrupted"] else "DOES NOT MATCH:\n  " + "\n  ".join(report["problems"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="draws the schedule (default 0)")
    parser.add_argument("--faults", type=int, default=6, help="faults to draw (default 6: one of each kind)")
    parser.add_argument("--out", type=Path, required=True, help="a new folder for the runs, logs and report")
    parser.add_argument("--kinds", default=",".join(KINDS), help="the kinds of fault to draw, comma-separated "
                                                                  "(default: all)")
    args = parser.parse_args(argv)
    if args.faults < 1:
        parser.error(f"--faults must be at least 1. Received: --faults {args.faults}.")
    kinds = tuple(args.kinds.split(","))
    if not kinds or not set(kinds) <= set(KINDS):
        parser.error(f"--kinds must name kinds of {', '.join(KINDS)}. Received: --kinds {args.kinds!r}.")
    args.out.mkdir(parents=True, exist_ok=True)
    soak = Soak(args.out.resolve(), args.seed, args.faults, kinds)
    try:
        report = soak.run()
    except PermissionError as err:
        print(f"soak: {err}", file=sys.stderr)
        return 3
    except SoakError as err:
        print(f"soak: FAILED: {err} (the launchers' lines: {soak.out / 'launchers.log'})", file=sys.stderr)
        return 1
    _print(report)
    return 0 if report["matches_uninterrupted"] else 1


if __name__ == "__main__":
    sys.exit(main())
