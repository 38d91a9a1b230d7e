"""docs/reference.md lists what the code has: every flag of `trainer-launch`, every `TRAINER_*` variable the
trainer reads, every row the plan can print; and nothing the code lacks. Its version matrix is checked by
tests/project/test_versions.py."""

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent
PAGE = (ROOT / "docs" / "reference.md").read_text()


def _section(heading: str) -> str:
    start = PAGE.index(f"## {heading}\n")
    end = PAGE.find("\n## ", start + 1)
    return PAGE[start:end if end > 0 else None]


def test_the_launchers_flags_are_the_pages():
    # The launcher starts without TensorFlow: its --help is quick.
    usage = subprocess.run([sys.executable, "-m", "trainer.launch", "--help"], capture_output=True, text=True,
                           timeout=60, check=True).stdout
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", usage)) - {"--help"}
    listed = set(re.findall(r"^\| `(--[a-z][a-z-]+)", _section("trainer-launch"), re.M))
    assert flags == listed, f"only in --help: {sorted(flags - listed)}; only on the page: {sorted(listed - flags)}"


def test_the_trainers_environment_variables_are_the_pages():
    sources = [*(ROOT / "trainer").rglob("*.py"), *(ROOT / "callbacks").rglob("*.py")]
    read = set().union(*(re.findall(r"\bTRAINER_[A-Z_]+\b", path.read_text()) for path in sources))
    listed = set(re.findall(r"`(TRAINER_[A-Z_]+)`", _section("Environment variables")))
    assert read <= listed, f"read by the code, not on the page: {sorted(read - listed)}"
    tests = set().union(*(re.findall(r"\bTRAINER_[A-Z_]+\b", path.read_text())
                          for path in [*(ROOT / "tests").rglob("*.py"), *(ROOT / ".ci").iterdir()]))
    assert listed <= read | tests, f"on the page, read nowhere: {sorted(listed - read - tests)}"


def test_the_plans_rows_are_the_pages():
    plan = ast.parse((ROOT / "trainer" / "engine" / "plan.py").read_text())
    describe = next(node for node in ast.walk(plan) if isinstance(node, ast.FunctionDef) and node.name == "describe")
    labels = {node.elts[0].value for node in ast.walk(describe)
              if isinstance(node, ast.Tuple) and len(node.elts) == 2
              and isinstance(node.elts[0], ast.Constant) and isinstance(node.elts[0].value, str)}
    listed = set(re.findall(r"^\| `([a-z][a-z /-]*)` \|", _section("The plan's rows"), re.M))
    assert labels == listed, f"only in the code: {sorted(labels - listed)}; only on the page: {sorted(listed - labels)}"
