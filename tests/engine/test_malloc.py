"""tf.data pins glibc's mmap threshold for the whole process; the trainer raises it back."""

import json
import platform

import pytest

from conftest import run_python, SCRIPTS
from trainer.engine import malloc

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def _tf_version() -> tuple[int, int]:
    import tensorflow as tf

    return tuple(int(part) for part in tf.__version__.split(".")[:2])


def _skip_unless_tensorflow_pinned(report: dict) -> None:
    """TensorFlow 2.18 and 2.22 leave the threshold alone (2.21 pins it: `ApplyPython311MemoryPatch`); there the
    trainer leaves it too, and says so."""
    from trainer._compat.version import TF_DATA_PINS_MALLOC

    if not TF_DATA_PINS_MALLOC:
        assert not report["after_tf_data"]["pinned"] and not report["after_fit"]["pinned"]
        assert report["raised"] is False and report["plan_process"].startswith("glibc's malloc left as found")
    if not report["after_tf_data"]["pinned"] and (_tf_version() < (2, 21) or not TF_DATA_PINS_MALLOC):
        pytest.skip(f"TensorFlow {'.'.join(map(str, _tf_version()))}'s tf.data leaves glibc's threshold alone")


def _run(mode: str = "fit", **env) -> dict:
    return run_python(SCRIPTS / "malloc_run.py", mode, env=env)


@pytest.mark.slow
def test_fit_on_a_dataset_undoes_the_threshold_tf_data_pins():
    report = _run()
    assert report["before"]["pinned"] is False
    _skip_unless_tensorflow_pinned(report)
    # TensorFlow pins it the first time a distributed iterator is read in a tf.function...
    assert report["after_tf_data"]["pinned"] is True
    # ...which makes every reuse of a 1 MiB buffer fault its 256 pages in again.
    assert report["after_tf_data"]["faults"] >= 20 * 256
    assert report["after_fit"]["pinned"] is False
    assert report["after_fit"]["faults"] < 20 * 256 / 10
    assert report["raised"] is True
    assert report["before"]["faults"] < 20 * 256 / 10
    assert report["plan_process"].startswith("glibc's mmap threshold raised to 32 MiB")


@pytest.mark.slow
def test_tune_malloc_false_leaves_the_process_as_tensorflow_set_it():
    report = _run("fit_untuned")
    _skip_unless_tensorflow_pinned(report)
    assert report["after_tf_data"]["pinned"] is True
    assert report["after_fit"]["pinned"] is True  # TensorFlow's pin stays
    assert report["raised"] is False
    assert "tune_malloc=False" in report["plan_process"]


@pytest.mark.slow
def test_pin_then_raise_spends_tensorflows_one_pin():
    from trainer._compat.version import TF_DATA_PINS_MALLOC

    report = _run("pin_then_raise")
    if not TF_DATA_PINS_MALLOC:  # nothing to undo: the process is left as it is
        assert report["pin_then_raise"] is False and not report["after_tf_data"]["pinned"]
        return
    assert report["before"]["pinned"] is False
    assert report["pin_then_raise"] is True
    assert report["after_pin_then_raise"]["pinned"] is False
    # TensorFlow pins once per process, so a later distributed iterator leaves
    # the raised threshold alone (without pin_then_raise it pins: test above).
    assert report["after_tf_data"]["pinned"] is False
    assert report["after_tf_data"]["faults"] < 20 * 256 / 10


def test_parameter_server_tasks_raise_the_threshold_before_serving(monkeypatch):
    import tensorflow as tf

    from trainer.launch import serve as serving

    calls = []
    monkeypatch.setattr(malloc, "pin_then_raise", lambda: calls.append("pin_then_raise"))
    monkeypatch.setattr(tf.distribute, "Server", lambda *a, **k: type("Server", (), {
        "join": lambda self: calls.append(("join", k["job_name"], k["task_index"]))})())
    cluster = {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"], "ps": ["localhost:4"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    serving.serve()
    assert calls == ["pin_then_raise", ("join", "worker", 1)]


@pytest.mark.slow
def test_a_threshold_the_user_set_is_left_alone():
    report = _run(MALLOC_MMAP_THRESHOLD_="131072")
    from trainer._compat.version import TF_DATA_PINS_MALLOC

    assert report["raised"] is False
    assert report["plan_process"] == "glibc's mmap threshold as the environment sets it", report["plan_process"]
    if not TF_DATA_PINS_MALLOC:  # the trainer calls no mallopt at all here (test_fit_on_a_dataset_... says so)
        return
    if not report["before"]["pinned"]:
        pytest.skip("the probe cannot see a fixed threshold in this Python's heap (it needs under 1 MiB free)")
    assert report["before"]["pinned"] is True  # the user's own 128 KiB
    assert report["after_fit"]["pinned"] is True
    assert report["raised"] is False


def test_user_set_threshold_reads_glibc_environment(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    assert not malloc.user_set_threshold()
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert malloc.user_set_threshold()
