"""Two local workers through trainer-launch: same numbers as one process; failures stop the job."""

import json
import os
import re
import subprocess
import time

import numpy as np
import pytest

from conftest import assert_same_run, ended, load_run, run_script, script_failed, SCRIPTS, start_script

pytestmark = pytest.mark.slow  # subprocesses, layouts or whole trainings: not in the everyday tier

SCRIPT = str(SCRIPTS / "multiworker_run.py")


def _launch(out, *extra, workers=2, env=None, timeout=240):
    """The launched job's process, to be checked by the caller: some jobs fail on purpose."""
    return run_script(SCRIPT, out, "multi_worker", *extra, launch=("--workers", workers), env=env, timeout=timeout,
                      check=False)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    run_script(SCRIPT, out, "default", timeout=240)
    return load_run(out, "single0")


def test_two_workers_match_the_single_process_run(tmp_path, reference):
    proc = _launch(tmp_path)
    assert proc.returncode == 0, script_failed(proc)
    assert proc.stdout.count("Training plan") == 1 and "[worker:0] Training plan" in proc.stdout
    assert "2 in sync over 2 worker(s)" in proc.stdout
    assert "cluster        trainer-launch on this machine: 2 workers; chief: worker 0" in proc.stdout
    assert not any(line.startswith("[worker:1] Epoch") for line in proc.stdout.splitlines())  # chief only
    worker0, worker1 = load_run(tmp_path, "worker0"), load_run(tmp_path, "worker1")
    assert worker0[0].pop("is_chief") and not worker1[0].pop("is_chief")
    assert worker0[0] == worker1[0]  # identical history and evaluate() on both workers, 2 replicas on each
    np.testing.assert_array_equal(worker0[1]["weights"], worker1[1]["weights"])
    assert_same_run(*worker0, reference)  # 1003 examples: an uneven last batch of 43
    files = tmp_path / "files"
    assert sorted(os.listdir(files)) == ["ckpt", "log.jsonl"]  # only the chief's files
    with open(files / "log.jsonl") as f:
        assert [json.loads(line)["epoch"] for line in f] == [0, 1]


@pytest.mark.full  # the full tier's scale layouts (TRAINER_TESTS=full)
def test_four_workers_of_two_replicas_match_the_single_process_run(tmp_path, reference):
    """trainer-launch --workers 4, each worker with 2 logical CPUs (2 GPUs per machine, simulated): 8 replicas
    in sync, and the last batch of 43 splits 6 + 6 + 6 + 5 x 5 over them."""
    proc = _launch(tmp_path, workers=4, env={"REPLICAS": "2"}, timeout=400)
    assert proc.returncode == 0, script_failed(proc)
    assert "8 in sync over 4 worker(s)" in proc.stdout
    assert "43 examples (3 replica(s) get 6, 5 get 5)" in proc.stdout
    results = [load_run(tmp_path, f"worker{i}") for i in range(4)]
    for result, arrays in results:
        result.pop("is_chief")
        assert result.pop("replicas") == 8
        np.testing.assert_array_equal(arrays["weights"], results[0][1]["weights"])
    assert_same_run(*results[0], reference)


@pytest.mark.full  # the full tier's scale layouts (TRAINER_TESTS=full)
def test_four_nodes_match_the_single_process_run(tmp_path, reference):
    """Four launchers as four nodes on localhost, one worker each (the chief on node 0)."""
    outs, statuses, failed = _nodes(tmp_path, nnodes="4", count=4, timeout=400)
    assert statuses == [0, 0, 0, 0], failed
    assert "trainer-launch on 4 nodes (node 0 at localhost): 4 workers; chief: worker 0" in outs[0]
    for i in range(4):
        assert_same_run(*load_run(tmp_path, f"worker{i}"), reference)


@pytest.mark.full  # the full tier's scale layouts (TRAINER_TESTS=full)
def test_eight_replicas_in_one_process_match_the_single_device_run(tmp_path, reference):
    """8 CPU replicas of one process: the last batch of 43 splits 6 + 6 + 6 + 5 x 5."""
    run_script(SCRIPT, tmp_path, "mirrored", env={"REPLICAS": "8"}, timeout=400)
    result, arrays = load_run(tmp_path, "single0")
    assert result.pop("replicas") == 8
    assert_same_run(result, arrays, reference)


@pytest.mark.full  # the full tier's: CI's tier kills workers under trainer-launch's restarts (test_soak.py)
def test_a_dead_worker_stops_the_job_and_backup_resumes_it(tmp_path, reference):
    start = time.monotonic()
    proc = _launch(tmp_path, "backup", env={"KILL_TASK": "worker1"})
    elapsed = time.monotonic() - start
    assert proc.returncode == 128 + 9, script_failed(proc)
    assert "[launcher] task worker:1 failed with exit status 137" in proc.stdout
    assert elapsed < 120
    assert (tmp_path / "files" / "backup" / "backup.npz").exists()

    # Resumed on another layout: one process of 2 CPU replicas, the same global batch.
    resumed = run_script(SCRIPT, tmp_path, "mirrored", "backup", env={"REPLICAS": "2"}, timeout=240)
    assert ("BackupAndRestore: resuming from epoch 1, step 8 (" in resumed.stdout
            and "written on 2 replica(s) over 2 worker(s))" in resumed.stdout), resumed.stdout[-3000:]
    result, arrays = load_run(tmp_path, "single0")
    assert result["epochs"] == [1] and result["replicas"] == 2
    np.testing.assert_allclose(arrays["weights"], reference[1]["weights"], rtol=1e-5, atol=1e-7)
    assert not (tmp_path / "files" / "backup" / "backup.npz").exists()


def test_a_sigterm_to_one_worker_makes_every_worker_save_the_same_step(tmp_path, reference):
    """Worker 1 alone is told to stop (at step 4; it acts at the boundary of step 8). It names the next
    boundary, step 12, through the coordination service; both workers save there, the chief writing the
    backup although it got no signal, and leave with 143. Alone, worker 1 would leave at step 8 and the
    chief would fail in the next all-reduce with nothing saved since the epoch's start."""
    proc = _launch(tmp_path, "epoch-backup", env={"TERM_TASK": "worker1"})
    assert proc.returncode == 143, script_failed(proc)
    assert ("BackupAndRestore: SIGTERM received by another worker; backup saved at epoch 1, step 12."
            in proc.stdout), proc.stdout[-3000:]
    assert "exit status 143" in proc.stdout and "exit status 1 " not in proc.stdout, proc.stdout[-3000:]

    resumed = run_script(SCRIPT, tmp_path, "mirrored", "epoch-backup", env={"REPLICAS": "2"}, timeout=240)
    assert "BackupAndRestore: resuming from epoch 1, step 12 (" in resumed.stdout, resumed.stdout[-3000:]
    result, arrays = load_run(tmp_path, "single0")
    np.testing.assert_allclose(arrays["weights"], reference[1]["weights"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(arrays["predictions"], reference[1]["predictions"], rtol=1e-5, atol=1e-6)


def _nodes(out, *extra, env=None, timeout=240, nnodes="2", options=(), count=2):
    """`count` launchers on this machine acting as nodes of one worker each; their outputs and statuses, and
    `script_failed` of them all."""
    from trainer.launch.job import free_ports

    port = free_ports(1)[0]
    procs = [start_script(SCRIPT, out, "multi_worker", *extra,
                          launch=("--nnodes", nnodes, "--node-rank", rank, "--master-addr", "localhost",
                                  "--master-port", port, *options),
                          env={"TRAINER_RDZV_SECRET": "test-secret", **(env or {})})
             for rank in range(count)]
    try:
        nodes = [ended(proc, timeout) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    return [node.stdout for node in nodes], [node.returncode for node in nodes], script_failed(*nodes)


def test_two_nodes_match_the_single_process_run(tmp_path, reference):
    (out0, out1), statuses, failed = _nodes(tmp_path)
    assert statuses == [0, 0], failed
    assert "[worker:0]   cluster        trainer-launch on 2 nodes (node 0 at localhost): 2 workers; chief: worker 0" \
        in out0
    assert "[worker:0]   replicas       2 in sync over 2 worker(s)" in out0 and "Training plan" not in out1
    assert_same_run(*load_run(tmp_path, "worker0"), reference)
    assert_same_run(*load_run(tmp_path, "worker1"), reference)


@pytest.mark.full  # the full tier's scale layouts (TRAINER_TESTS=full)
def test_a_node_gone_mid_epoch_stops_the_job_and_the_rerun_resumes(tmp_path, reference):
    """Node 1's launcher and worker die at epoch 1, step 8 (its machine gone): node 0 stops with a message
    naming it and leaves no process; running both nodes again resumes from the backup."""
    start = time.monotonic()
    (out0, _), statuses, failed = _nodes(tmp_path, "backup", env={"KILL_NODE": "worker1"})
    assert statuses == [1, -9], failed
    assert "[launcher] node 1's launcher is gone (its machine stopped, or it was killed); stopping every task" in out0
    assert time.monotonic() - start < 120
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes left running: {left}"

    (out0, out1), statuses, failed = _nodes(tmp_path, "backup")
    assert statuses == [0, 0], failed
    assert "[worker:0] BackupAndRestore: resuming from epoch 1, step 8" in out0
    result, arrays = load_run(tmp_path, "worker1")
    assert result["epochs"] == [1]
    np.testing.assert_allclose(arrays["weights"], reference[1]["weights"], rtol=1e-5, atol=1e-7)


def test_an_elastic_job_resumes_exactly_on_the_node_that_is_left(tmp_path, reference):
    """A job over 1 to 2 nodes with one restart; node 1 dies at epoch 1, step 8. Node 0 meets the rendezvous
    alone, and its worker resumes from the backup that trainer-launch asked fit for (at the epoch's start, or at
    the step where the launcher's SIGTERM stopped it) on one replica: the uninterrupted run's weights."""
    env = {"KILL_NODE": "worker1", "TRAINER_BACKUP_DIR": str(tmp_path / "elastic")}
    (out0, _), statuses, failed = _nodes(tmp_path, env=env, nnodes="1:2",
                                         options=("--max-restarts", "1", "--rdzv-last-call", "1"))
    assert statuses == [0, -9], failed
    assert "[launcher] restart 1 of 1: 1 node, 1 worker now (before: 2 nodes, 2 workers)" in out0
    assert ("[worker:0]   cluster        trainer-launch on 1 node (node 0 at localhost), restart 1 of 1 (before: 2 "
            "nodes, 2 workers): 1 worker; chief: worker 0") in out0
    # Node 0's launcher stops its worker with a SIGTERM once node 1 is gone; the worker's backup then saves at the
    # next boundary (step 8) if it gets there before the lost peer ends it, else the epoch's start (step 0) stands.
    # Which one is a race; either resumes to the uninterrupted run's numbers (asserted below).
    assert (re.search(r"\[worker:0\] BackupAndRestore: resuming from epoch 1, step [08] \(", out0)
            and "written on 2 replica(s) over 2 worker(s))" in out0), out0[-3000:]
    result, arrays = load_run(tmp_path, "worker0")
    assert result["epochs"] == [1] and result["replicas"] == 1
    np.testing.assert_allclose(arrays["weights"], reference[1]["weights"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(arrays["predictions"], reference[1]["predictions"], rtol=1e-5, atol=1e-6)
    assert not os.listdir(tmp_path / "elastic" / "fit-1")  # the backup goes once training completes


SIGTERM_SCRIPT = """
import os, signal, sys, time
from trainer import Trainer, cluster_info
trainer = Trainer(strategy="multi_worker")  # starts the cluster's coordination service
with open("/proc/self/status") as f:
    caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt")) >> (signal.SIGTERM - 1) & 1
print("SIGTERM caught in C:", bool(caught), flush=True)
if cluster_info().task_id == 1:
    os.kill(os.getpid(), signal.SIGTERM)  # a stop before training begins (a launcher's, Slurm's)
    time.sleep(30)
    print("alive 30 s after SIGTERM", flush=True)
time.sleep(30)
"""


def test_a_sigterm_before_training_ends_a_worker_at_once(tmp_path):
    """TensorFlow's coordination service catches SIGTERM in C++ for its preemption notifier, and a worker then
    lived on after one; the trainer puts Python's handler back when it makes the strategy."""
    script = tmp_path / "sigterm.py"
    script.write_text(SIGTERM_SCRIPT)
    start = time.monotonic()
    proc = run_script(script, launch=("--workers", 2), timeout=120, check=False)
    assert proc.returncode == 143, script_failed(proc)
    assert proc.stdout.count("SIGTERM caught in C: False") == 2, proc.stdout[-3000:]
    assert "[launcher] task worker:1 was stopped by SIGTERM (exit status 143)" in proc.stdout
    assert "alive" not in proc.stdout and time.monotonic() - start < 25


def test_a_dead_peer_is_named_by_every_survivor_not_a_hang():
    """Three workers without a launcher; worker 1 dies: both others end with an error naming it."""
    from trainer.launch.job import cluster_spec, free_ports
    from trainer.launch.supervise import tf_config

    cluster = cluster_spec(3, 0, free_ports(3))
    procs = [start_script(SCRIPTS / "dead_peer_run.py", env={"TF_CONFIG": tf_config(cluster, "worker", i)})
             for i in range(3)]
    try:
        workers = [ended(proc, 120) for proc in procs]  # a hang would time out here
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert [worker.returncode for worker in workers] == [1, -9, 1], script_failed(*workers)
    for worker in (workers[0], workers[2]):
        assert (f"RuntimeError: A collective failed in epoch 0 near step 6: worker 1 ({cluster['worker'][1]}) is "
                "probably gone or stuck") in worker.stdout, script_failed(worker)


def test_uneven_last_batches_of_datasets_on_two_workers_match_one_process(tmp_path):
    """Embedding and CNN models on datasets: a last batch split evenly over the workers in a fused call
    (its sparse gradient's all-gather changes shape), and one smaller than the worker count; oneDNN on.
    The same data as a batched dataset and as a PyDataset (every worker reads every batch) match too."""
    script = str(SCRIPTS / "multiworker_last_batch_run.py")
    env = {"TF_ENABLE_ONEDNN_OPTS": "1"}
    (tmp_path / "single").mkdir()
    run_script(script, tmp_path / "single", "default", env=env, timeout=240)
    run_script(script, tmp_path, "multi_worker", launch=("--workers", 2), env=env, timeout=240)
    with open(tmp_path / "single" / "single0.json") as f:
        reference = json.load(f)
    reference_weights = np.load(tmp_path / "single" / "single0.npz")
    assert sorted(reference) == [f"{family}/{case}" for family in ("cnn", "embedding")
                                 for case in ("batched", "fused", "pydataset", "tiny")]
    for task in ("worker0", "worker1"):
        with open(tmp_path / f"{task}.json") as f:
            result = json.load(f)
        weights = np.load(tmp_path / f"{task}.npz")
        for key, run in reference.items():
            for name, values in run["history"].items():
                np.testing.assert_allclose(result[key]["history"][name], values, rtol=1e-5, err_msg=f"{key} {name}")
            for name, value in run["evaluate"].items():
                np.testing.assert_allclose(result[key]["evaluate"][name], value, rtol=1e-5, err_msg=f"{key} {name}")
            np.testing.assert_allclose(weights[key], reference_weights[key], rtol=1e-5, atol=1e-6, err_msg=key)


# The full tier's `distribute` (TRAINER_TESTS=full): CI's tier runs the tutorial through fit.
@pytest.mark.parametrize("mode", ["fit", pytest.param("distribute", marks=pytest.mark.full)])
def test_tensorflows_multi_worker_tutorial_trains_on_two_workers(tmp_path, mode):
    """The tutorial's strategy made first, its model built in the strategy's scope (keras-team/keras#20585: Keras 3's
    own fit fails there), moved to `Trainer(strategy=strategy).fit` and to `Trainer().distribute()`: the Trainer
    takes the user's strategy instead of making a second one in the process, and the workers end equal."""
    from trainer.launch.job import cluster_spec, free_ports
    from trainer.launch.supervise import tf_config

    cluster = cluster_spec(2, 0, free_ports(2))
    procs = [start_script(SCRIPTS / "tutorial_run.py", mode, tmp_path / f"{i}.json",
                          env={"TF_CONFIG": tf_config(cluster, "worker", i)}) for i in range(2)]
    try:
        workers = [ended(proc, 300) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert [worker.returncode for worker in workers] == [0, 0], script_failed(*workers)
    runs = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    assert runs[0] == runs[1]  # the workers agree exactly: history, weights, steps
    assert list(runs[0]["history"]) == ["accuracy", "loss"] and runs[0]["iterations"] == 210
    assert runs[0]["weights"] != runs[0]["initial"]  # it trained (the labels are random: the loss may not fall)
    if mode == "fit":  # Trainer(strategy="multi_worker") with a model built outside the scope: refused first
        assert runs[0]["refusal"].startswith("`strategy` must be the MultiWorkerMirroredStrategy this process runs"), \
            runs[0]["refusal"]
