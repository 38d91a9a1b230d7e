"""Same seed, same global batch: same numbers on 1 device or 4 replicas."""

import numpy as np
import pytest

from conftest import assert_same_run, run_python, SCRIPTS, tiny_data

pytestmark = pytest.mark.slow  # subprocesses, layouts or whole trainings: not in the everyday tier

LAYOUTS = [("none", 1), ("mirrored", 1), ("mirrored", 2), ("mirrored", 4)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, devices in LAYOUTS:
        path = tmp_path_factory.mktemp("layout") / f"{name}{devices}.npz"
        result = run_python(SCRIPTS / "layout_run.py", name, str(devices), str(path))
        assert result["replicas"] == devices
        out[(name, devices)] = (result, dict(np.load(path)))
    return out


def _softmax_ce(logits, labels):
    logits = logits - logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    return -log_probs[np.arange(len(labels)), labels]


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=lambda layout: f"{layout[0]}{layout[1]}")
def test_uneven_last_batch_matches_single_device(runs, layout):
    reference = runs[("none", 1)]
    result, arrays = runs[layout]
    assert result["history"].keys() == reference[0]["history"].keys()
    assert_same_run(result, arrays, reference)
    assert arrays["predictions"].shape == (1003, 3)


def test_training_actually_moved_the_weights(runs):
    result, _ = runs[("none", 1)]
    losses = result["history"]["loss"]
    assert losses[1] < losses[0]


@pytest.mark.parametrize("layout", [("none", 1), ("mirrored", 4)], ids=["1replica", "4replicas"])
def test_epoch_loss_is_weighted_sum_over_all_examples(runs, layout):
    # What model.fit reports: sum(w * loss) / N, the objective the optimizer minimizes.
    x, y, w = tiny_data(1003)
    result, arrays = runs[layout]
    per_example = _softmax_ce(arrays["frozen_logits"].astype(np.float64), y)
    expected = np.sum(w * per_example) / len(y) + float(arrays["frozen_reg"])
    np.testing.assert_allclose(result["frozen_loss"], expected, rtol=1e-5)


def test_evaluate_weighted_metric_matches_numpy(runs):
    x, y, w = tiny_data(1003)
    result, arrays = runs[("mirrored", 4)]
    per_example = _softmax_ce(arrays["predictions"].astype(np.float64), y)
    np.testing.assert_allclose(result["evaluate"]["wce"], np.sum(w * per_example) / np.sum(w), rtol=1e-5)
    accuracy = np.mean(np.argmax(arrays["predictions"], axis=1) == y)
    np.testing.assert_allclose(result["evaluate"]["accuracy"], accuracy, rtol=1e-6)
