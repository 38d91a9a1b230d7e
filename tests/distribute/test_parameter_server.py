"""Parameter-server training on a local cluster of 1 ps and 2 workers (plus the coordinator)."""

import json

import numpy as np
import pytest

from conftest import ended, run_script, script_failed, SCRIPTS, start_script, tiny_data

pytestmark = pytest.mark.slow  # subprocesses, layouts or whole trainings: not in the everyday tier

SCRIPT = str(SCRIPTS / "ps_run.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ps")
    run_script(SCRIPT, out / "default.json", "default")
    proc = run_script(SCRIPT, out / "ps.json", "parameter_server", launch=("--workers", 2, "--ps", 1))
    with open(out / "default.json") as f, open(out / "ps.json") as g:
        return json.load(f), json.load(g), proc.stdout


def test_reaches_the_default_strategys_accuracy_band(results):
    default, ps, stdout = results
    assert "ParameterServerStrategy (asynchronous)" in stdout and "over 2 worker(s)" in stdout
    assert ps["evaluate"]["accuracy"] > 0.85
    assert abs(ps["evaluate"]["accuracy"] - default["evaluate"]["accuracy"]) < 0.08
    assert ps["history"]["loss"][-1] < ps["history"]["loss"][0]


def test_every_scheduled_step_is_counted(results):
    default, ps, _ = results
    assert ps["iterations"] == default["iterations"] == 4 * 32


def test_evaluation_is_exact_on_the_coordinator(results):
    _, ps, _ = results
    x, y, w = tiny_data(1003)
    logits = np.asarray(ps["logits"], dtype=np.float64)
    assert logits.shape == (1003, 3)
    shifted = logits - logits.max(axis=1, keepdims=True)
    ce = -(shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True)))[np.arange(len(y)), y]
    np.testing.assert_allclose(ps["evaluate"]["wce"], np.sum(w * ce) / np.sum(w), rtol=1e-5)
    np.testing.assert_allclose(ps["evaluate"]["accuracy"], np.mean(logits.argmax(axis=1) == y), rtol=1e-6)


@pytest.mark.full  # the full tier's scale layout (TRAINER_TESTS=full)
def test_three_workers_and_two_ps_tasks_count_every_step_and_evaluate_exactly(tmp_path, results):
    """A larger parameter-server cluster (issue 40's scale): 3 workers and 2 ps tasks take every scheduled
    step, and the coordinator's evaluation is exact for the weights it ends with."""
    default, _, _ = results
    proc = run_script(SCRIPT, tmp_path / "ps.json", "parameter_server", "first", launch=("--workers", 3, "--ps", 2),
                      timeout=400)
    assert "over 3 worker(s)" in proc.stdout
    with open(tmp_path / "ps.json") as f:
        ps = json.load(f)
    assert ps["iterations"] == default["iterations"] == 4 * 32
    logits = np.asarray(ps["logits"], dtype=np.float64)
    x, y, _ = tiny_data(1003)
    np.testing.assert_allclose(ps["evaluate"]["accuracy"], np.mean(logits.argmax(axis=1) == y), rtol=1e-6)
    assert ps["evaluate"]["accuracy"] > 0.85


def test_a_model_without_regularization_trains(results):
    default, ps, _ = results
    for run in (default, ps):
        (loss,) = run["plain_loss"]
        assert 0.0 < loss < np.log(3) + 0.5  # a finite cross-entropy over 3 classes, from random weights


def test_gradient_accumulation_and_ema_overwrite_run_on_the_workers(results):
    # Keras applies both inside a `cond`, through a merge call that a worker's replica cannot make
    # in a graph; the trainer applies them once, in cross-replica context. 8 steps make 4 updates.
    _, ps, _ = results
    assert ps["accumulated"]["steps"] == 8 and ps["accumulated"]["updates"] == 4
    assert np.isfinite(ps["accumulated"]["loss"][0])


def test_a_model_instance_built_outside_any_scope_trains_with_its_variables_on_the_ps_tasks(results):
    default, ps, _ = results
    assert all("/job:ps" in device for device in ps["instance"]["devices"]), ps["instance"]["devices"]
    assert not any("/job:ps" in device for device in ps["instance"]["home"])  # home again after the fit
    assert not any("/job:ps" in device for device in default["instance"]["devices"])
    assert ps["instance"]["iterations"] == default["instance"]["iterations"] == 8


def test_a_variable_partitioner_splits_the_instance_over_the_ps_tasks_with_the_unsplit_numbers(tmp_path):
    # One worker runs its steps in order, so splitting variables over 2 ps tasks must change no number: an
    # Embedding's sparse gradient and AdamW's update, weight decay and slots all go through the shards.
    runs = {}
    for partitioned in ("0", "1"):
        out = tmp_path / f"partitioned{partitioned}.npz"
        proc = run_script(SCRIPTS / "ps_partitioned_run.py", out, partitioned, launch=("--workers", 1, "--ps", 2))
        with open(f"{out}.json") as f:
            runs[partitioned] = json.load(f), dict(np.load(out)), proc.stdout
    (whole, whole_arrays, _), (split, split_arrays, stdout) = runs["0"], runs["1"]
    assert all(len(devices) == 1 for devices in whole["devices"].values())
    for name in ("sequential/embedding/embeddings", "sequential/dense/kernel"):  # over 64 bytes: 2 shards
        assert sorted(split["devices"][name]) == ["/job:ps/replica:0/task:0/device:CPU:0",
                                                  "/job:ps/replica:0/task:1/device:CPU:0"], split["devices"]
    assert "split over the ps tasks by the variable_partitioner" in stdout
    assert not any("/job:ps" in device for device in split["home"])  # whole and home again after the fit
    assert split["iterations"] == whole["iterations"] == 3 * 13
    assert split["history"].keys() == whole["history"].keys() == {"loss", "accuracy"}
    for key, values in whole["history"].items():
        np.testing.assert_allclose(split["history"][key], values, rtol=1e-6)
    for key, value in whole["evaluate"].items():
        np.testing.assert_allclose(split["evaluate"][key], value, rtol=1e-6)
    # 5 weights and 12 AdamW variables, the outputs, and the accumulating model's 4 weights and 18 Adam variables
    # (iterations, learning rate, and 4 each of moments, velocities, accumulators and averages).
    assert whole_arrays.keys() == split_arrays.keys() and len(whole_arrays) == 18 + 4 + 18
    for key, value in whole_arrays.items():
        np.testing.assert_allclose(split_arrays[key], value, rtol=1e-6, atol=1e-7, err_msg=key)


@pytest.mark.full  # the full tier's (TRAINER_TESTS=full)
def test_parameter_server_training_over_two_nodes(tmp_path, results):
    """trainer-launch on two nodes (launchers on localhost): the chief and a worker on node 0, a worker and
    the ps task on node 1; it trains as the one-machine cluster does, and node 1 stops when the chief is done."""
    from trainer.launch.job import free_ports

    default, _, _ = results
    port = free_ports(1)[0]
    procs = [start_script(SCRIPT, tmp_path / "ps.json", "parameter_server",
                          launch=("--nnodes", 2, "--node-rank", rank, "--master-addr", "localhost", "--master-port",
                                  port, "--workers", 1, "--ps", rank),
                          env={"TRAINER_RDZV_SECRET": "test-secret"})
             for rank in (0, 1)]
    try:
        nodes = [ended(proc, 300) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [node.returncode for node in nodes] == [0, 0], script_failed(*nodes)
    outs = [node.stdout for node in nodes]
    assert ("cluster        trainer-launch on 2 nodes (node 0 at localhost): 1 chief, 2 workers, 1 ps; chief: the "
            "chief task") in outs[0]
    assert "[chief:0]" in outs[0] and "[ps:0]" not in outs[0] and "[chief:0]" not in outs[1]
    ps = json.loads((tmp_path / "ps.json").read_text())
    assert ps["iterations"] == default["iterations"] == 4 * 32
    assert ps["evaluate"]["accuracy"] > 0.85
    assert all("/job:ps" in device for device in ps["instance"]["devices"])


TUTORIAL = str(SCRIPTS / "ps_tutorial_run.py")


def _plan_rows(stdout: str) -> dict[str, str]:
    """The plan's rows by name, from a run's output (a task's prefix dropped)."""
    lines = [line.split("] ", 1)[-1] if line.startswith("[") else line for line in stdout.splitlines()]
    start = lines.index("Training plan")
    rows = {}
    for line in lines[start + 1:]:
        if not line.startswith("  "):
            break
        name, _, value = line.strip().partition(" ")
        rows[name] = value.strip()
    return rows


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory):
    """TensorFlow's parameter-server tutorial, its Model.fit section with its tf.data.Dataset made on the
    coordinator and Keras's own TensorBoard, ModelCheckpoint and BackupAndRestore, on the tutorial's
    in-process cluster and on a TF_CONFIG cluster of a chief, 2 workers and a ps task."""
    runs = {}
    for cluster in ("in_process", "tf_config"):
        out = tmp_path_factory.mktemp(cluster)
        proc = run_script(TUTORIAL, cluster, out, launch=() if cluster == "in_process" else ("--workers", 2, "--ps", 1))
        result = json.loads(proc.stdout.strip().splitlines()[-1].split("] ", 1)[-1])
        runs[cluster] = result, _plan_rows(proc.stdout), out
    return runs


@pytest.mark.parametrize("cluster", ["in_process", "tf_config"])
def test_the_tutorials_dataset_and_callbacks_train_on_both_kinds_of_cluster(tutorial, cluster):
    result, plan, out = tutorial[cluster]
    assert result["iterations"] == 5 * 20  # every scheduled step counted
    assert result["loss"][-1] < result["loss"][0]  # 10 fixed points, fitted by a Dense layer
    assert result["reloaded"] and all(result["reloaded"])  # ModelCheckpoint's .keras file holds the trained weights
    assert result["tensorboard"] == ["train"]  # TensorBoard wrote the coordinator's logs
    assert not result["backup_left"]  # Keras's BackupAndRestore removes its backup when training ends
    assert plan["replicas"] == "1 in sync over 2 worker(s)"
    assert plan["batch"] == "global 64 = 64 per replica x 1 (the batched dataset's batches)"


def test_both_kinds_of_cluster_make_the_same_decisions(tutorial):
    in_process, tf_config = tutorial["in_process"][1], tutorial["tf_config"][1]
    assert tf_config.pop("cluster").startswith("trainer-launch")  # where TF_CONFIG came from: its one extra row
    assert in_process == tf_config
