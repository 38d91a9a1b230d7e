"""Under a real Slurm (one node on localhost, tests/helpers/slurm_cluster.py): `srun -n 2 python job.py` with
strategy="auto" trains one MultiWorkerMirroredStrategy job with the single process's numbers."""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import assert_same_run, run_script, script_failed, SCRIPTS, TESTS

sys.path.insert(0, str(TESTS))
import slurm_cluster  # noqa: E402

pytestmark = pytest.mark.slow  # a Slurm cluster and whole trainings: not in the everyday tier

SCRIPT = str(SCRIPTS / "multiworker_run.py")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    yield from slurm_cluster.one_node(tmp_path_factory.mktemp("slurm"))


def _load(out, task):
    with open(out / f"{task}.json") as f:
        return json.load(f), dict(np.load(out / f"{task}.npz"))


def _srun(slurm, tasks, out, *args, kill_on_bad_exit=True, env=None, timeout=300):
    env = {**slurm.env, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    command = ["srun", "-n", str(tasks), *(["--kill-on-bad-exit=1"] if kill_on_bad_exit else []), sys.executable,
               SCRIPT, str(out), "auto", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, cwd=TESTS)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    run_script(SCRIPT, out, "default")
    return _load(out, "single0")


def test_srun_of_two_tasks_trains_as_one_process(slurm, reference, tmp_path):
    proc = _srun(slurm, 2, tmp_path)
    assert proc.returncode == 0, script_failed(proc)
    assert proc.stdout.count("Training plan") == 1  # the chief's, task 0
    assert "2 in sync over 2 worker(s)" in proc.stdout
    assert "cluster        Slurm: 2 tasks on 1 node, chief task 0 (job " in proc.stdout
    worker0, worker1 = _load(tmp_path, "worker0"), _load(tmp_path, "worker1")
    assert (worker0[0]["replicas"], worker0[0]["is_chief"]) == (2, True)
    assert (worker1[0]["replicas"], worker1[0]["is_chief"]) == (2, False)
    np.testing.assert_array_equal(worker0[1]["weights"], worker1[1]["weights"])
    assert_same_run(*worker0, reference)  # 1003 examples: an uneven last batch
    assert sorted(os.listdir(tmp_path / "files")) == ["ckpt", "log.jsonl"]  # only the chief writes


@pytest.mark.full  # the full tier's, with the Slurm soak (test_soak.py); CI's names a dead peer in test_multiworker
def test_a_task_killed_mid_epoch_is_named_by_the_survivor_and_a_new_job_resumes(slurm, reference, tmp_path):
    """Task 1 dies at epoch 1, step 8; with Slurm's default (no --kill-on-bad-exit) srun waits for task 0,
    which ends with an error naming worker 1 and its address. The job submitted again resumes from the
    backup to the uninterrupted run's weights."""
    proc = _srun(slurm, 2, tmp_path, "backup", kill_on_bad_exit=False, env={"KILL_TASK": "worker1"}, timeout=200)
    assert proc.returncode != 0
    assert "RuntimeError: A collective failed in epoch 1 near step 8: worker 1 (" in proc.stdout + proc.stderr, \
        proc.stdout[-3000:] + proc.stderr[-3000:]
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left running: {left}"

    resumed = _srun(slurm, 2, tmp_path, "backup")
    assert resumed.returncode == 0, script_failed(resumed)
    assert "BackupAndRestore: resuming from epoch 1, step 8" in resumed.stdout
    result, arrays = _load(tmp_path, "worker0")
    assert result["epochs"] == [1]
    np.testing.assert_allclose(arrays["weights"], reference[1]["weights"], rtol=1e-5, atol=1e-7)


def _until(ready, timeout, what):
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"no {what} after {timeout} s"
        time.sleep(0.2)


def _state(slurm, job):
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], env=slurm.env, capture_output=True,
                          text=True).stdout.strip()


@pytest.mark.full  # the full tier's (TRAINER_TESTS=full): a minute each
def test_a_requeued_job_saves_on_sigterm_and_resumes_exactly(slurm, reference, tmp_path):
    """A job submitted as examples/slurm/fashion_mnist.sbatch submits it (--requeue, a log appended to,
    TRAINER_BACKUP_DIR): both tasks wait at epoch 1, step 8, as in a long run, and `scontrol requeue` (what a
    preemption does) stops them. On SIGTERM they agree to save at the next step boundary, step 12 (no
    worker can be past it); Slurm queues the job again, and the new run resumes from that backup to the
    uninterrupted run's weights."""
    log = tmp_path / "job.out"
    job = tmp_path / "job.sbatch"
    job.write_text("\n".join([
        "#!/bin/bash", "#SBATCH --ntasks=2", "#SBATCH --requeue", "#SBATCH --open-mode=append",
        f"#SBATCH --output={log}", f"export TRAINER_BACKUP_DIR={tmp_path / 'backup'}",
        f"srun --kill-on-bad-exit=1 {sys.executable} {SCRIPT} {tmp_path} auto", ""]))
    env = {**slurm.env, "TF_CPP_MIN_LOG_LEVEL": "2", "HOLD": "1"}
    submitted = subprocess.run(["sbatch", "--parsable", str(job)], env=env, capture_output=True, text=True, cwd=TESTS)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    _until(lambda: all((tmp_path / f"holding-worker{i}").exists() for i in (0, 1)), 120, "task at epoch 1, step 8")
    subprocess.run(["scontrol", "requeue", job_id], env=env, check=True)
    # Slurm keeps a requeued batch job from starting for about two minutes; the test lets it start at once.
    _until(lambda: _state(slurm, job_id) == "PENDING", 60, "requeued job")
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env, check=True)
    _until(lambda: not _state(slurm, job_id), 180, "end of the requeued job")
    out = log.read_text()
    assert "BackupAndRestore: SIGTERM received; backup saved at epoch 1, step 12." in out, out[-3000:]
    assert "BackupAndRestore: resuming from epoch 1, step 12 (" in out, out[-3000:]
    result, arrays = _load(tmp_path, "worker0")
    assert result["epochs"] == [1]
    np.testing.assert_allclose(arrays["weights"], reference[1]["weights"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(arrays["predictions"], reference[1]["predictions"], rtol=1e-5, atol=1e-6)


def test_srun_of_one_task_is_one_process(slurm, reference, tmp_path):
    proc = _srun(slurm, 1, tmp_path)
    assert proc.returncode == 0, script_failed(proc)
    assert "1 in sync over 1 worker(s)" in proc.stdout and "cluster  " not in proc.stdout
    single = _load(tmp_path, "single0")
    assert single[0]["replicas"] == 1
    assert_same_run(*single, reference)


@pytest.mark.full  # the full tier's (TRAINER_TESTS=full): a minute each
def test_the_examples_sbatch_script_trains_on_two_tasks(slurm, tmp_path):
    # examples/slurm/fashion_mnist.sbatch as a user submits it, on this one-node cluster's CPUs.
    log = tmp_path / "job.out"
    command = ["sbatch", "--wait", "--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1",
               f"--output={log}", str(TESTS.parent / "examples" / "slurm" / "fashion_mnist.sbatch"),
               "--synthetic", "512", "--epochs", "1", "--out", str(tmp_path / "run")]
    env = {key: value for key, value in slurm.env.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    backup = tmp_path / "backup"
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=TESTS.parent,
                          env={**env, "PYTHON": sys.executable, "TRAINER_BACKUP_DIR": str(backup)})
    out = log.read_text()
    assert proc.returncode == 0, proc.stderr + out[-3000:]
    assert (backup / "fit-1").is_dir() and not os.listdir(backup / "fit-1")  # backed up, and gone once done
    assert out.count("Training plan") == 1 and "cluster        Slurm: 2 tasks on 1 node, chief task 0" in out
    assert "2 in sync over 2 worker(s)" in out and "Restored without a strategy: test accuracy" in out
    assert out.startswith("Training plan")  # nothing of TensorFlow's start-up, from either task


@pytest.mark.full  # the full tier's (TRAINER_TESTS=full): a minute each
def test_parameter_server_training_under_srun_of_trainer_launch(slurm, tmp_path):
    # Task 0 runs the script as the chief, task 2 serves as the ps task and task 1 as the worker; the servers
    # end when the chief's script has ended, so srun returns.
    out = tmp_path / "ps.json"
    command = ["srun", "-n", "3", "--overcommit", "--kill-on-bad-exit=1",  # 3 tasks on this node's 2 CPUs
               sys.executable, "-m", "trainer.launch", "--ps", "1", str(SCRIPTS / "ps_run.py"), str(out),
               "parameter_server"]
    proc = subprocess.run(command, capture_output=True, text=True, env={**slurm.env, "TF_CPP_MIN_LOG_LEVEL": "2"},
                          timeout=300, cwd=TESTS)
    assert proc.returncode == 0, script_failed(proc)
    assert "ParameterServerStrategy (asynchronous)" in proc.stdout and "over 1 worker(s)" in proc.stdout
    assert "cluster        trainer-launch under Slurm (job " in proc.stdout
    assert "step 0): 1 chief, 1 worker, 1 ps; chief: the chief task" in proc.stdout
    result = json.loads(out.read_text())
    assert result["iterations"] == 4 * 32 and result["evaluate"]["accuracy"] > 0.85
    assert all("/job:ps" in device for device in result["instance"]["devices"])


def test_under_srun_the_launcher_takes_its_tasks_from_slurm(slurm, tmp_path):
    command = ["srun", "-n", "2", sys.executable, "-m", "trainer.launch", "--workers", "2", SCRIPT, str(tmp_path),
               "auto"]
    proc = subprocess.run(command, capture_output=True, text=True, env=slurm.env, timeout=120, cwd=TESTS)
    assert proc.returncode != 0
    assert "under srun, the step's 2 tasks are the cluster. Received: --workers 2. Drop --workers" in proc.stderr
    too_many_ps = [*command[:4], "-m", "trainer.launch", "--ps", "1", *command[-3:]]
    proc = subprocess.run(too_many_ps, capture_output=True, text=True, env=slurm.env, timeout=120, cwd=TESTS)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "`--ps` must leave a chief and at least one worker among the step's 2 tasks. Received: --ps 1" in proc.stderr
