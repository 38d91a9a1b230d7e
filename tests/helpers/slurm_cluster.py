"""A real one-node Slurm cluster on localhost for the tests: munged, slurmctld and slurmd from Debian's packages.

Everything lives in one folder of the test's (key, sockets, spool, logs and
`slurm.conf`, which `SLURM_CONF` names to every Slurm command), so nothing of
the machine's own configuration is read or changed. Install the packages with:

    apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge"
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sinfo")


def missing() -> list[str]:
    """The Slurm and munge programs this machine lacks (the test is skipped with the install command)."""
    return [name for name in PROGRAMS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]


def why_not_here() -> str | None:
    """Why this machine can't run the one-node cluster, or None: the tests that need it skip with the reason."""
    if missing():
        return f"Slurm is not installed here (no {', '.join(missing())}): {PACKAGES}"
    if os.geteuid() != 0:
        return "the one-node Slurm runs its daemons as root (SlurmUser=root); run the tests as root"
    host = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(host)  # Slurm names the node by it, and the tasks reach each other there
    except OSError:
        return f"this machine's name {host!r} does not resolve; add it to /etc/hosts to run the Slurm tests"
    return None


def one_node(folder: Path):
    """A fixture's body: the cluster started in `folder`, stopped after the tests; skipped where it can't run."""
    import pytest

    why_not = why_not_here()
    if why_not:
        pytest.skip(why_not)
    folder.chmod(0o700)  # munged refuses a key folder that others can write
    cluster = Slurm(folder).start()
    yield cluster
    cluster.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


class Slurm:
    """A running one-node cluster; `env` is what a Slurm command needs to reach it."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.host = socket.gethostname().split(".")[0]
        self.env = {**os.environ, "SLURM_CONF": str(folder / "slurm.conf")}
        self._daemons: list[subprocess.Popen] = []

    def start(self, timeout: float = 60) -> Slurm:
        folder = self.folder
        for name in ("spool/ctld", "spool/d", "log", "munge"):
            (folder / name).mkdir(parents=True, exist_ok=True)
        key = folder / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge_socket = folder / "munge" / "munge.socket"
        self._spawn([_program("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={munge_socket}",
                     f"--pid-file={folder / 'munge' / 'munged.pid'}", f"--log-file={folder / 'log' / 'munged.log'}",
                     f"--seed-file={folder / 'munge' / 'munged.seed'}"])
        self._wait(lambda: munge_socket.exists(), timeout, "munged's socket")
        (folder / "slurm.conf").write_text(self._config(munge_socket))
        self._spawn([_program("slurmctld"), "-D", "-i"])
        self._spawn([_program("slurmd"), "-D"])
        self._wait(self._idle, timeout, "the node to be idle (sinfo)")
        return self

    def _config(self, munge_socket: Path) -> str:
        folder = self.folder
        return "\n".join([
            "ClusterName=trainertest", f"SlurmctldHost={self.host}", "SlurmUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={munge_socket}", "CredType=cred/munge",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
            "SwitchType=switch/none", "JobAcctGatherType=jobacct_gather/none",
            "SchedulerParameters=sched_interval=1",  # a queued job starts within a second, not a minute
            f"StateSaveLocation={folder / 'spool' / 'ctld'}", f"SlurmdSpoolDir={folder / 'spool' / 'd'}",
            f"SlurmctldPidFile={folder / 'slurmctld.pid'}", f"SlurmdPidFile={folder / 'slurmd.pid'}",
            f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={folder / 'log' / 'slurmd.log'}",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
            "",
        ])

    def _spawn(self, command: list[str]) -> None:
        log = open(self.folder / "log" / f"{Path(command[0]).name}.out", "w")
        self._daemons.append(subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True))

    def _idle(self) -> bool:
        for daemon in self._daemons:
            if daemon.poll() is not None:
                raise RuntimeError(f"{daemon.args[0]} exited with {daemon.returncode}; see {self.folder / 'log'}")
        proc = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True)
        return proc.returncode == 0 and proc.stdout.strip() == "idle"

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                self.stop()
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in (self.folder / "log").iterdir())
                raise RuntimeError(f"Slurm did not come up: no {what} after {timeout} s.\n{logs}")
            time.sleep(0.2)

    def stop(self) -> None:
        for daemon in reversed(self._daemons):
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
        for daemon in self._daemons:
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()
        self._daemons = []
