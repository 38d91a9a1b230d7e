"""docs/reference.md lists what the code has: every flag of `trainer-launch`, every `TRAINER_*` variable the
trainer reads, every row the plan can print; and nothing the code lacks. Its version matrix is the range
setup.cfg allows and CI tests."""

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




def _release(version: str) -> tuple[int, int, int]:
    """(major, minor, patch), a missing part 0: `3.8` is `3.8.0`."""
    major, minor, patch = (int(part) for part in (version.split(".") + ["0", "0"])[:3])
    return major, minor, patch


def _major_minor(version: str) -> tuple[int, int]:
    return _release(version)[:2]


def test_the_version_matrix_is_the_range_ci_tests():
    """The Versions table's two tiers are setup.cfg's range, .ci/oldest's pins and `_compat.version.TESTED`,
    read as text (no TensorFlow import)."""
    setup = (ROOT / "setup.cfg").read_text()
    requires = setup[setup.index("install_requires ="):setup.index("\n[", setup.index("install_requires ="))]
    ranges = re.findall(r"\b(tensorflow|keras)>=([\d.]+),<([\d.]+)", requires)
    low, high = {name: floor for name, floor, _ in ranges}, {name: ceiling for name, _, ceiling in ranges}
    oldest = dict(re.findall(r"\b(tensorflow|keras)==([\d.]+)", (ROOT / ".ci" / "oldest").read_text()))
    assert set(low) == set(high) == set(oldest) == {"tensorflow", "keras"}, (low, high, oldest)
    # The oldest tier pins setup.cfg's floor; the newest tier's minor version is the last one below its ceiling.
    for name in ("tensorflow", "keras"):
        assert _release(oldest[name]) == _release(low[name]), (name, oldest[name], low[name])
    newest = {}
    for name, ceiling in high.items():
        major, minor = _major_minor(ceiling)
        assert minor > 0, f"{name}<{ceiling}: the newest tested minor version is not the one below the ceiling"
        newest[name] = f"{major}.{minor - 1}"

    section = _section("Versions")
    tiers = {row[0]: row[1:] for row in re.findall(r"^\| (newest|oldest) \| ([\d.]+) \| ([\d.]+) \|", section, re.M)}
    assert tiers == {"newest": (newest["tensorflow"], newest["keras"]),
                     "oldest": (oldest["tensorflow"], oldest["keras"])}, tiers
    bounds = ", ".join(f"`{name}>={low[name]},<{high[name]}`" for name in ("tensorflow", "keras"))
    assert bounds in section, bounds
    python = re.search(r"^python_requires = >=([\d.]+)$", setup, re.M)[1]
    assert f"Python {python} or newer (`python_requires`)" in section, python

    # What the trainer checks before a fit (trainer/_compat/version.py) is the same range.
    version_py = (ROOT / "trainer" / "_compat" / "version.py").read_text()
    tested = {name.lower(): ((int(a), int(b)), (int(c), int(d))) for name, a, b, c, d in re.findall(
        r'"(Keras|TensorFlow)": \(\((\d+), (\d+)\), \((\d+), (\d+)\)\)', version_py)}
    assert tested == {name: (_major_minor(oldest[name]), _major_minor(newest[name])) for name in oldest}, tested
