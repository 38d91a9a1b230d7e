"""What Keras's own tests turned up (tests/keras/test_keras_suite.py), held against model.fit with ordinary models.

Each case of tests/scripts/keras_contract_run.py runs as Keras's own methods on one
device (the reference) and inside `with Trainer().distribute():` on 1, 2 and 3
replicas, and the GAN of train_on_batch calls on 2 workers: what the code saw
must be the same, keys, types and values.
"""

import json
import math

import pytest

from conftest import run_script, SCRIPTS

pytestmark = pytest.mark.slow

SCRIPT = str(SCRIPTS / "keras_contract_run.py")


def _run(out, replicas, runner, *cases, workers=0):
    run_script(SCRIPT, out, replicas, runner, *cases, launch=("--workers", workers) if workers else (), timeout=400)
    with open(out / "task0.json") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("keras"), 1, "keras")


def _assert_same(got, want, where="", rtol=1e-5, atol=1e-6):
    """Equal structure (dict keys in order, lengths, strings) and numbers within the tolerance."""
    if isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for key in want:
            _assert_same(got[key], want[key], f"{where}.{key}", rtol, atol)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: {got} != {want}"
        for i, (a, b) in enumerate(zip(got, want)):
            _assert_same(a, b, f"{where}[{i}]", rtol, atol)
    elif isinstance(want, float) and isinstance(got, float):
        assert (math.isnan(got) and math.isnan(want)) or math.isclose(got, want, rel_tol=rtol, abs_tol=atol), \
            f"{where}: {got} != {want}"
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_keras_contract_cases_give_model_fits_results(reference, replicas, tmp_path):
    got = _run(tmp_path, replicas, "trainer")
    for case in reference:
        _assert_same(got[case], reference[case], case)


def test_the_reference_sees_what_keras_gives(reference):
    # The cases check what they mean to: values Keras's own methods give, that the old trainer did not.
    received = reference["vector_logs"]["received"][0]
    assert received["f1_score"][0] == "ndarray" and len(received["f1_score"][1]) == 3
    assert received["loss"][0] == "float"
    assert reference["vector_logs"]["stopped_epoch"] == 1
    assert "nan" in reference["nan_logs"]["csv"][1]
    assert len(reference["on_batch"]["seen"]) == 8


def test_a_gan_of_train_on_batch_calls_on_two_workers_gives_one_devices_numbers(reference, tmp_path):
    got = _run(tmp_path, 1, "trainer", "on_batch", workers=2)
    _assert_same(got["on_batch"], reference["on_batch"], "on_batch")
    with open(tmp_path / "task1.json") as f:
        _assert_same(json.load(f)["on_batch"]["weights"], got["on_batch"]["weights"], "worker 1's weights", 0, 0)
