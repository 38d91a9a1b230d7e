"""tf.data pins glibc's mmap threshold for the whole process; the trainer raises it back."""

import json
import os
import platform
import subprocess
import sys

import pytest

from trainer import malloc

HERE = os.path.dirname(__file__)
pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def _run(**env) -> dict:
    out = subprocess.run([sys.executable, os.path.join(HERE, "malloc_run.py")], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fit_on_a_dataset_undoes_the_threshold_tf_data_pins():
    report = _run()
    assert report["before"]["pinned"] is False
    # TensorFlow pins it the first time a distributed iterator is read in a tf.function...
    assert report["after_tf_data"]["pinned"] is True
    # ...which makes every reuse of a 1 MiB buffer fault its 256 pages in again.
    assert report["after_tf_data"]["faults"] >= 20 * 256
    assert report["after_fit"]["pinned"] is False
    assert report["after_fit"]["faults"] < 20 * 256 / 10
    assert report["raised"] is True
    assert report["before"]["faults"] < 20 * 256 / 10


def test_a_threshold_the_user_set_is_left_alone():
    report = _run(MALLOC_MMAP_THRESHOLD_="131072")
    assert report["before"]["pinned"] is True  # the user's own 128 KiB
    assert report["after_fit"]["pinned"] is True
    assert report["raised"] is False


def test_user_set_threshold_reads_glibc_environment(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1")
    assert not malloc.user_set_threshold()
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert malloc.user_set_threshold()
