"""docs/ecosystem.md's snippets run as pasted (in a fresh interpreter each, in a scratch folder)."""

import re

import pytest

from conftest import run_code, script_failed, TESTS

DOC = (TESTS.parent / "docs" / "ecosystem.md").read_text()
SNIPPETS = re.findall(r"```python\n(.*?)```", DOC, re.S)
NEEDS = {"keras_hub": "keras_hub", "mlflow": "mlflow", "wandb": "wandb", "keras_tuner": "keras_tuner",
         "ray": "ray.train"}

pytestmark = pytest.mark.slow  # a fresh interpreter per snippet


def _title(code: str) -> str:
    return next((name for name in NEEDS if re.search(rf"^import .*\b{name}\b", code, re.M)), "tensorflow")


# Ray's snippet starts a Ray cluster of two workers (nearly 3 minutes here): the full tier's (TRAINER_TESTS=full);
# CI's tier runs tests/keras/test_ecosystem.py's Ray job.
@pytest.mark.parametrize("code", [pytest.param(code, marks=pytest.mark.full) if _title(code) == "ray" else code
                                  for code in SNIPPETS], ids=[_title(code) for code in SNIPPETS])
def test_a_snippet_runs_as_pasted(code, tmp_path):
    for name, module in NEEDS.items():
        if re.search(rf"^import .*\b{name}\b", code, re.M):
            pytest.importorskip(module, reason=f"{module} is in the 'ecosystem' extra")
    proc = run_code(code, timeout=600, cwd=tmp_path, env={"WANDB_SILENT": "true"}, check=False)
    assert proc.returncode == 0, script_failed(proc)


def test_the_page_has_a_snippet_for_each_tool():
    assert sorted(_title(code) for code in SNIPPETS) == sorted(
        ["keras_hub", "mlflow", "mlflow", "keras_tuner", "ray", "tensorflow", "tensorflow"])
