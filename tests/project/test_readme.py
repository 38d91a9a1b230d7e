"""The README's quickstart runs as pasted (its set-up commands: tests/project/test_setup_scripts.py)."""

import pytest
import re
import subprocess
import sys

from conftest import script_failed, TESTS

README = (TESTS.parent / "README.md").read_text()


@pytest.mark.slow
def test_quickstart_runs_as_pasted(tmp_path):
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, script_failed(proc)
    assert "replicas       2 in sync over 1 worker(s)" in proc.stdout
    assert re.search(r"^\[[0-9.]+, [0-9.]+\] \[\[", proc.stdout, re.M), proc.stdout[-2000:]  # [loss, accuracy]
