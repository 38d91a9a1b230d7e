"""The fault soak (soak.py): a job over two nodes meets random faults and ends as the uninterrupted run.

CI draws 3 faults of the kinds no other test strikes (a kill inside a backup's write, a full disk while one
is written, a kill during the rendezvous) on trainer-launch's two nodes; the full tier draws 20, of every
kind, there and under Slurm. Both train on a tf.data pipeline that reshuffles each pass, whose place the
backups hold (trainer/data/marks.py). docs/testing.md reports the full tier's figures.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import script_failed, SCRIPTS

pytestmark = pytest.mark.slow  # whole multi-node jobs: not in the everyday tier

SOAK = str(SCRIPTS / "soak.py")


def _soak(out, seed: int, faults: int, kinds: str | None = None, slurm: bool = False, data: str = "arrays") -> dict:
    if os.geteuid() != 0:
        pytest.skip("the soak's full disk is a small tmpfs it mounts (and Slurm's daemons run as root): run the "
                    "tests as root")
    command = [sys.executable, SOAK, "--seed", str(seed), "--faults", str(faults), "--out", str(out)]
    command += (["--kinds", kinds] if kinds else []) + (["--slurm"] if slurm else []) + ["--data", data]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1500)
    if proc.returncode == 3:
        pytest.skip(f"this machine can't run the soak: {proc.stderr.strip()}")
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
    assert proc.returncode == 0 and report is not None, script_failed(proc)
    assert report["matches_uninterrupted"] and not report["problems"], proc.stdout
    assert report["fault_count"] == faults == len(report["faults"])
    for fault in report["faults"]:
        assert fault["fired_at"] is not None, fault  # every fault struck
        assert fault["restart_seconds"] is not None or "the job ended before a restart" in fault["notes"], fault
    return report


def test_a_kill_in_a_write_a_full_disk_and_a_kill_in_the_rendezvous_lose_nothing(tmp_path):
    report = _soak(tmp_path, seed=11, faults=3, kinds="kill-in-write,full-disk,kill-in-rendezvous", data="reshuffled")
    kinds = {fault["kind"] for fault in report["faults"]}
    assert kinds <= {"kill-in-write", "kill-after-write", "full-disk", "kill-in-rendezvous"}, kinds
    assert {"full-disk", "kill-in-rendezvous"} <= kinds


@pytest.mark.full  # the full tier's (TRAINER_TESTS=full): about 3 minutes, and 5 under Slurm
@pytest.mark.parametrize("slurm", [False, True], ids=["trainer-launch", "slurm"])
def test_twenty_random_faults_of_every_kind_lose_nothing(tmp_path, slurm):
    report = _soak(tmp_path, seed=3, faults=20, slurm=slurm, data="reshuffled")  # the backups hold its place
    kinds = {fault["kind"] for fault in report["faults"]}
    assert kinds >= {"kill-worker", "term-worker", "kill-in-write", "kill-launcher", "full-disk",
                     "kill-in-rendezvous"}, kinds
