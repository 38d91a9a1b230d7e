"""The self-check (`python -m trainer.check`, `trainer-launch --check`): its report, and its exit status, which
is 1 when the replicas train other numbers than one device."""

import json
import os
import subprocess
import sys

import pytest

from conftest import TESTS

ENV = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}  # as a user runs it: notices hidden


def _run(*command, env=None, timeout=300):
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env or ENV,
                          cwd=TESTS.parent)


def test_the_check_on_two_cpu_replicas_reports_and_passes():
    done = _run(sys.executable, "-m", "trainer.check", "--cpu-replicas", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    assert list(rows) == ["versions", "cuda", "gpus", "cpu", "onednn", "xla", "cluster", "replicas", "exactness",
                          "speed", "result"]
    assert "TensorFlow 2." in rows["versions"] and "Keras 3." in rows["versions"]
    assert "2 in sync" in rows["replicas"] and "this process alone" in rows["cluster"]
    assert rows["result"].split()[1] == "PASS:"
    assert done.stderr == "", done.stderr  # no TensorFlow start-up notices, no cuInit line


def test_the_json_report_has_the_figures():
    done = _run(sys.executable, "-m", "trainer.check", "--cpu-replicas", "3", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    exact, speed = report["exactness"], report["speed"]
    assert exact["replicas"] == 3 and exact["holds"] and exact["weights"] < 1e-6
    assert speed["one_device"] > 0 and speed["replicas"] > 0
    assert report["seconds"] < 60


def test_the_check_on_two_workers_passes_on_each():
    done = _run(sys.executable, "-m", "trainer.launch", "--workers", "2", "--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[worker:0]   result     PASS: one device's numbers hold on 2 replica(s)" in done.stdout
    assert "[worker:1] worker 1: PASS" in done.stdout
    assert "trainer-launch on this machine: 2 workers" in done.stdout


def test_the_check_fails_with_status_1_when_the_replicas_train_other_numbers(tmp_path):
    # The replicas' fit reads a model with another Dropout seed: other numbers, as a lost example gives.
    script = tmp_path / "broken_check.py"
    script.write_text(
        "import sys\nimport trainer.check as check\n"
        "made = check._model\ncalls = []\n"
        "def model(keras, *shape):\n"
        "    calls.append(1)\n"
        "    m = made(keras, *shape)\n"
        "    if len(calls) == 2:\n"
        "        m.layers[1].seed_generator.state.assign([9, 0])\n"
        "    return m\n"
        "check._model = model\nsys.exit(check.main(['--cpu-replicas', '2']))\n")
    done = _run(sys.executable, str(script))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL: 2 replica(s) trained other numbers than one device" in done.stdout
    assert "docs/troubleshooting.md" in done.stdout


@pytest.mark.parametrize("command, message", [
    (("-m", "trainer.check", "--cpu-replicas", "0"), "--cpu-replicas must be an integer >= 1"),
    (("-m", "trainer.launch", "--check", "train.py"), "--check runs the self-check in place of a script"),
    (("-m", "trainer.launch", "--ps", "1", "--check"), "--check trains on workers in sync"),
])
def test_bad_arguments_are_usage_errors(command, message):
    done = _run(sys.executable, *command, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
