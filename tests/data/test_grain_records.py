"""Grain's random-access datasets: one device's numbers in every layout, and each worker reads its records only.

Each layout (1 and 3 CPU replicas, 2 through the accelerator reader, 2 workers through trainer-launch on both
readers) trains every form of tests/scripts/grain_records_run.py through the trainer, against `model.fit` on one device
given the same grain datasets: history (keys too), evaluate, weights, predictions and the optimizer's step
count; and counts the records the source handed out in a steady epoch.
"""


import numpy as np
import pytest

from conftest import load_run, run_script, SCRIPTS
from trainer.data import readers

pytest.importorskip("grain")  # the 'ecosystem' extra
pytestmark = pytest.mark.slow  # subprocesses, layouts or whole trainings: not in the everyday tier

SCRIPT = str(SCRIPTS / "grain_records_run.py")
FORMS = ["batch_fn", "records", "shuffled"]
RECORDS = 100  # in batches of 24: 12 + 12 rows a batch for each of 2 workers, 2 + 2 of the last batch of 4


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    run_script(SCRIPT, out, "--reference")
    return load_run(out, "single0")


def _assert_one_device(results, arrays, reference):
    expected, expected_arrays = reference
    assert sorted(results) == FORMS
    for form, result in results.items():
        assert sorted(result["history"]) == sorted(expected[form]["history"]), form
        for key, values in expected[form]["history"].items():
            np.testing.assert_allclose(result["history"][key], values, rtol=1e-5, err_msg=f"{form}: {key}")
        for key, value in expected[form]["evaluate"].items():
            np.testing.assert_allclose(result["evaluate"][key], value, rtol=1e-5, err_msg=f"{form}: {key}")
        assert result["iterations"] == expected[form]["iterations"], form
        for key in ("weights", "predictions"):
            np.testing.assert_allclose(arrays[f"{form}/{key}"], expected_arrays[f"{form}/{key}"], rtol=1e-5,
                                       atol=1e-6, err_msg=f"{form}: {key}")


@pytest.mark.parametrize("replicas, env", [(1, {}), (3, {}), (2, {readers.ACCELERATOR_READER: "1"})],
                         ids=["1 replica", "3 replicas", "2 replicas, accelerator reader"])
def test_one_process_reads_every_record_and_gives_one_devices_numbers(tmp_path, reference, replicas, env):
    run_script(SCRIPT, tmp_path, "--replicas", replicas, env=env)
    results, arrays = load_run(tmp_path, "single0")
    _assert_one_device(results, arrays, reference)
    assert reference[0]["records"]["read"] == [RECORDS, RECORDS]  # model.fit's own reading
    assert all(result["read"] == [RECORDS, RECORDS] for result in results.values())


@pytest.mark.parametrize("env", [{}, {readers.ACCELERATOR_READER: "1"}], ids=["in the step", "accelerator reader"])
def test_each_of_two_workers_reads_half_the_records_with_one_devices_numbers(tmp_path, reference, env):
    """A batch made by the user's `batch_fn` comes whole, so every worker reads all of it; the plans say so."""
    proc = run_script(SCRIPT, tmp_path, launch=("--workers", "2"), env=env)
    for task in ("worker0", "worker1"):
        results, arrays = load_run(tmp_path, task)
        _assert_one_device(results, arrays, reference)
        assert results["records"]["read"] == results["shuffled"]["read"] == [RECORDS // 2] * 2, task
        assert results["batch_fn"]["read"] == [RECORDS, RECORDS], task
    plans = [line for line in proc.stdout.splitlines() if "sharding" in line]
    assert len(plans) == 3 and all(plan.startswith("[worker:0]") for plan in plans), proc.stdout[-3000:]
    by_record = "OFF: each worker reads only its replicas' records of every batch of the grain dataset (1/2 of them)"
    whole = "OFF: every worker reads every batch of the grain dataset (it yields whole batches)"
    assert [by_record in plans[0], by_record in plans[1], whole in plans[2]] == [True, True, True], plans
