"""Both doors give one device's `model.fit`: `trainer.fit(model, ...)` and `with trainer.distribute():
model.fit(...)`, on 2 replicas and on 2 workers, each printing its plan. It runs in every tier, so on each
Keras and TensorFlow CI tests (the next tier's pre-release pair too) the route reaches the trainer's steps and
gives Keras's numbers (tests/scripts/entries_run.py)."""

import pytest

from conftest import assert_same_run, load_run, run_script, SCRIPTS

pytestmark = pytest.mark.slow
SCRIPT = SCRIPTS / "entries_run.py"


@pytest.fixture(scope="module")
def keras_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("keras")
    run_script(SCRIPT, out, "--reference")
    return load_run(out, "kerassingle0")


@pytest.mark.parametrize("layout", ["2 replicas", "2 workers"])
def test_both_doors_give_one_devices_model_fit(tmp_path, keras_run, layout):
    if layout == "2 replicas":
        proc, tasks = run_script(SCRIPT, tmp_path, "--replicas", "2"), ["single0"]
        in_sync = "2 in sync over 1 worker(s)"
    else:
        proc, tasks = run_script(SCRIPT, tmp_path, launch=("--workers", "2")), ["worker0", "worker1"]
        in_sync = "2 in sync over 2 worker(s)"
    assert proc.stdout.count("Training plan") == 2, proc.stdout  # once per fit, on the chief
    assert proc.stdout.count(in_sync) == 2, proc.stdout
    for door in ("fit", "distribute"):
        for task in tasks:
            result, arrays = load_run(tmp_path, door + task)
            assert result["history"].keys() == keras_run[0]["history"].keys() == {"loss", "accuracy"}
            assert_same_run(result, arrays, keras_run)
