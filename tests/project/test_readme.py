"""The README's quickstart runs as pasted and prints the plan the README shows (its set-up commands:
tests/project/test_setup_scripts.py)."""

import pytest
import re
import subprocess
import sys

from conftest import script_failed, TESTS

from trainer._compat.version import TF_DATA_PINS_MALLOC  # noqa: E402

README = (TESTS.parent / "README.md").read_text()
# The rows whose text depends on the machine: the README shows their start (precision's hint names the CPU's
# 16-bit arithmetic, where it has some).
MACHINE_ROWS = {"precision"}


def plan_rows(text: str) -> list[tuple[str, str]]:
    """(label, text) of each row of the first plan printed in `text`, in order."""
    lines = text[text.index("Training plan\n"):].splitlines()[1:]
    rows = []
    for line in lines:
        row = re.match(r"^  (\S+(?: \S+)*)\s{2,}(.*)$", line)
        if row is None:
            break
        rows.append((row[1], row[2]))
    return rows


@pytest.mark.slow
def test_quickstart_runs_as_pasted(tmp_path):
    code = re.search(r"```python\n(.*?)```", README, re.S).group(1)
    assert len(code.strip().splitlines()) <= 10
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, script_failed(proc)
    assert "replicas       2 in sync over 1 worker(s)" in proc.stdout
    assert re.search(r"^\[[0-9.]+, [0-9.]+\] \[\[", proc.stdout, re.M), proc.stdout[-2000:]  # [loss, accuracy]
    shown = plan_rows(re.search(r"## Quickstart.*?```text\n(.*?)```", README, re.S).group(1))
    printed = plan_rows(proc.stdout)
    # The README's machine has oneDNN on (AVX-512); a CPU without it (AVX2 only) adds the row that says so.
    hint = [text for label, text in printed if label == "cpu kernels" and "cpu kernels" not in dict(shown)]
    assert all(text.startswith("oneDNN kernels off in this process") for text in hint), hint
    printed = [row for row in printed if row[0] != "cpu kernels" or "cpu kernels" in dict(shown)]
    assert [label for label, _ in shown] == [label for label, _ in printed], proc.stdout
    for (label, text), (_, printed_text) in zip(shown, printed):
        if label in MACHINE_ROWS:
            assert printed_text.startswith(text), (label, printed_text)
        elif label == "process" and not TF_DATA_PINS_MALLOC:  # the README's is TensorFlow 2.21's, which pins it
            assert printed_text.startswith("glibc's malloc left as found"), printed_text
        else:
            assert printed_text == text, (label, printed_text)


def test_the_quickstart_makes_its_trainer_before_its_data_and_model():
    # On several workers the strategy must exist before TensorFlow runs anything: a model built before the
    # Trainer is refused there ("Create the Trainer ... at the top of the script"), so a quickstart that
    # makes it later is not "the same script" the README runs on a cluster.
    lines = re.search(r"```python\n(.*?)```", README, re.S).group(1).splitlines()
    first = {what: next(i for i, line in enumerate(lines) if re.search(pattern, line))
             for what, pattern in (("trainer", r"= Trainer\("), ("data", r"np\.random\."),
                                   ("model", r"keras\.(Sequential|Model|Input)\("))}
    assert first["trainer"] < min(first["data"], first["model"]), lines
