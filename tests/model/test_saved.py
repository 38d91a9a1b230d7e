"""What `fit` leaves behind is what model.fit leaves: after Trainer.fit on 1 or 2 replicas or 2 workers, the user's
model and optimizer save, export and reload as after model.fit on one device (tests/scripts/saved_run.py):
model.save and load_model, save_weights and load_weights, model.export's `serve`, tf.saved_model.save, and a
tf.train.Checkpoint of the model and its optimizer, for a plain model and for a KerasHub task fine-tuned with LoRA."""

import importlib.util
import pickle

import keras
import numpy as np
import pytest

from conftest import FULL, run_script, SCRIPTS, TESTS

pytestmark = pytest.mark.slow  # subprocesses, one per layout

HUB = importlib.util.find_spec("keras_hub") is not None
CASES = ["plain", "lora"] if HUB else ["plain"]
KEPT = ["predict", "load_model", "load_weights", "export", "saved_model", "checkpoint", "checkpoint_restored"]


def _run(replicas: int, workers: bool, cases: list[str], out) -> list[dict]:
    run_script(SCRIPTS / "saved_run.py", replicas, ",".join(cases), out, launch=("--workers", 2) if workers else (),
               cwd=TESTS, timeout=600)
    paths = [f"{out}.worker{task}" for task in (0, 1)] if workers else [out]
    runs = []
    for path in paths:
        with open(path, "rb") as f:
            runs.append(pickle.load(f))
    return runs


def _assert_close(ours, theirs, what):
    if isinstance(theirs, dict) and what in ("saved_model", "checkpoint"):  # variables by their checkpoint keys
        assert sorted(ours) == sorted(theirs), what
    for a, b in zip(keras.tree.flatten(ours), keras.tree.flatten(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=what)


@pytest.mark.parametrize("replicas,workers", [pytest.param(1, False, marks=pytest.mark.full), (2, False), (1, True)],
                         ids=["1replica", "2replicas", "2workers"])
def test_after_trainer_fit_the_model_saves_exports_and_reloads_as_after_model_fit(tmp_path, replicas, workers):
    cases = ["plain"] if workers and not FULL else CASES  # LoRA on 2 workers: the full tier's
    for run in _run(replicas, workers, cases, tmp_path / "kept.pkl"):
        assert sorted(run) == sorted(cases)
        for case, kept in run.items():
            theirs, ours = kept["model.fit"], kept["trainer.fit"]
            assert not np.allclose(ours["predict"], ours["initial"]), f"{case}: the model did not train"
            for what in KEPT:
                _assert_close(ours[what], theirs[what], f"{case}: {what}")
