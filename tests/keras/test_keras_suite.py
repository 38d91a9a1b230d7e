"""Keras's own tests of fit, evaluate, predict and the callbacks, beneath the trainer (tests/keras_suite/).

The installed Keras's `trainers/trainer_test.py` and `callbacks/*_test.py`,
from its source distribution, run inside `with Trainer(...).distribute():` on
2 replicas (and on one device in the full tier), each layout in a process of its own; the tests
that do not pass there run again on Keras alone (running all of them there
first would cost 7 minutes for the same verdicts). A test that
passes on Keras alone must pass beneath the trainer, except those
tests/keras_suite/excused.py lists with the reason.
"""

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from conftest import FULL
from keras_suite.excused import excused
from keras_suite.keras_plugin import keras_test_files

pytestmark = pytest.mark.slow

def _run(mode: str, folder: Path, tests: list[str]) -> dict[str, str]:
    """Runs Keras's `tests` (files, or test ids under the downloaded folder) in `mode`; {test id: outcome}."""
    root = keras_test_files(keras.__version__)[0].parent.parent
    results = folder / f"{mode}.json"
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "KERAS_SUITE_MODE": mode,
           "KERAS_SUITE_RESULTS": str(results), "TF_CPP_MIN_LOG_LEVEL": "2",
           "PYTHONPATH": str(Path(__file__).parent.parent / "keras_suite")}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "keras_plugin", "-p", "no:cacheprovider", "-c", os.devnull,
         "--rootdir", str(root), "--import-mode=importlib", "-W", "ignore::DeprecationWarning", *tests],
        env=env, cwd=root, capture_output=True, text=True, timeout=1500)
    assert results.exists(), f"Keras's tests did not run in mode {mode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(results.read_text())


# CI's tier runs 2 replicas, whose list of exceptions holds the one device's; one device's run (7 more minutes of
# CI) is the full tier's (TRAINER_TESTS=full), with Keras parity on one device in CI (test_keras_parity.py).
@pytest.mark.parametrize("replicas", [pytest.param("1", marks=pytest.mark.full), "2"])
def test_keras_suite_passes_beneath_the_trainer(replicas, tmp_path):
    files = keras_test_files(keras.__version__, full=FULL)
    beneath = _run(replicas, tmp_path, [str(path) for path in files])
    passed = [test for test, outcome in beneath.items() if outcome == "passed"]
    assert len(passed) > 150, f"only {len(passed)} of Keras's tests passed beneath the trainer: {beneath}"
    # What does not pass beneath the trainer runs again on Keras alone: what fails there too is not asked of us.
    others = sorted(test for test, outcome in beneath.items() if outcome != "passed")
    plain = _run("plain", tmp_path, others) if others else {}
    failing = [test for test in others if plain.get(test) == "passed"]
    listed = excused(replicas, full=FULL)
    unlisted = sorted(test for test in failing if not any(fnmatch.fnmatch(_short(test), p) for p in listed))
    assert not unlisted, f"{len(unlisted)} of Keras's tests pass on Keras alone but not on {replicas} replica(s): " \
                         f"{unlisted}"
    stale = sorted(p for p in listed if not any(fnmatch.fnmatch(_short(test), p) for test in failing))
    assert not stale, f"tests/keras_suite/excused.py lists tests that now pass on {replicas} replica(s): {stale}"


def _short(nodeid: str) -> str:
    """`trainers/trainer_test.py::TestTrainer::test_fit_flow_eager` -> `TestTrainer::test_fit_flow_eager`."""
    return nodeid.split("::", 1)[-1]
