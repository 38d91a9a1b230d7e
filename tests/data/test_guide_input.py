"""TFRecord files with each auto_shard_policy, and tf.data service datasets, through both routes.

tests/scripts/guide_input_run.py trains them through `Trainer.fit` and through `model.fit` inside
`Trainer.distribute()`, on 2 CPU replicas in one process and on 2 workers, against `model.fit` on one device
(history, the optimizer's steps, weights). On one worker a policy changes nothing. On two, DATA and FILE give each
worker the sets TensorFlow's own strategy gives it, which here are one device's batches (each of a batch's two files
is read by one worker), and OFF gives every worker every file: each reads all of it in batches of half the global
batch, so an epoch has twice the steps, and both routes give the same numbers. A tf.data service job of each
worker's own gives it every batch, in either mode; a job the workers share by its name hands each other batches, as
TensorFlow's strategy reads it."""

import json

import numpy as np
import pytest

from conftest import run_script, SCRIPTS
from trainer import _compat

pytestmark = pytest.mark.slow  # subprocesses, layouts or whole trainings: not in the everyday tier

SCRIPT = str(SCRIPTS / "guide_input_run.py")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    run_script(SCRIPT, folder, "--write")
    return folder


@pytest.fixture(scope="module")
def reference(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    run_script(SCRIPT, files, out, "--reference")
    return json.loads((out / "single0.json").read_text())


def _assert_same(result, expected, name):
    assert sorted(result["history"]) == sorted(expected["history"]), name
    for key, values in expected["history"].items():
        np.testing.assert_allclose(result["history"][key], values, rtol=1e-5, err_msg=f"{name}: {key}")
    assert result["iterations"] == expected["iterations"], name
    np.testing.assert_allclose(result["weights"], expected["weights"], rtol=1e-5, atol=1e-6, err_msg=name)


def test_on_two_replicas_every_policy_and_the_service_give_one_devices_numbers(files, reference, tmp_path):
    run_script(SCRIPT, files, tmp_path, "--replicas", 2)
    results = json.loads((tmp_path / "single0.json").read_text())
    assert len(results) == 10  # 3 policies and the service's 2 modes, each through both routes
    for name, result in results.items():
        _assert_same(result, reference[name.split("/")[0] if name.startswith("service") else "files"], name)
    # 12 steps, and up to Keras 3.15 model.fit's call past the end of each epoch
    assert reference["files"]["iterations"] == (15 if _compat.one_step_calls_past_end() else 12)


def test_on_two_workers_each_policy_gives_tensorflows_sets_through_both_routes(files, reference, tmp_path):
    from trainer.launch.job import free_ports

    run_script(SCRIPT, files, tmp_path, "--shared-service-port", free_ports(1)[0], launch=("--workers", "2"))
    tasks = [json.loads((tmp_path / f"{task}.json").read_text()) for task in ("worker0", "worker1")]
    for task, results in zip(("worker0", "worker1"), tasks):
        for policy in ("DATA", "FILE"):
            for route in ("trainer", "block"):
                _assert_same(results[f"files_{policy}/{route}"], reference["files"], f"{task} {policy} {route}")
        for mode in ("service", "service_distributed"):  # a job of the worker's own: every batch, as one device
            for route in ("trainer", "block"):
                _assert_same(results[f"{mode}/{route}"], reference[mode], f"{task} {mode} {route}")
        # A job the workers share hands each other batches: every example once an epoch (the targets' sum is one
        # device's), in other global batches, as TensorFlow's strategy reads it; the plan says so.
        for route in ("trainer", "block"):
            shared = results[f"shared_job/{route}"]
            np.testing.assert_allclose(shared["history"]["target_sum"], reference["files"]["history"]["target_sum"],
                                       rtol=1e-5, err_msg=f"{task} {route}")
            assert not np.allclose(shared["weights"], reference["files"]["weights"], rtol=1e-3), (task, route)
        assert results["sharding"]["own job"].startswith("every worker reads all of the data")
        assert "share the tf.data service job 'shared_x'" in results["sharding"]["shared job"]
        off, off_block = results["files_OFF/trainer"], results["files_OFF/block"]
        # every worker reads all 96 examples, 12 a step (and calls past the end up to Keras 3.15)
        assert off["iterations"] == 3 * 8 + (3 if _compat.one_step_calls_past_end() else 0)
        np.testing.assert_allclose(off["weights"], off_block["weights"], rtol=1e-6)
        assert not np.allclose(off["weights"], reference["files"]["weights"], rtol=1e-3)
    for route in ("trainer", "block"):  # the workers, handed other batches, still end equal
        np.testing.assert_array_equal(*(results[f"shared_job/{route}"]["weights"] for results in tasks))
