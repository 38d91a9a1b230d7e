"""Every Python block of the README and docs/ runs as pasted, unless the line before it marks it
`<!-- fragment -->` (a few lines that need a model and data the page does not make; those must parse)."""

import re

import pytest

from conftest import run_code, script_failed, TESTS

ROOT = TESTS.parent
# Run by tests of their own: the README's quickstart (tests/project/test_readme.py, which also compares its plan)
# and docs/ecosystem.md's snippets (tests/keras/test_ecosystem_docs.py, with the extras each needs).
ELSEWHERE = {"docs/ecosystem.md"}
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]


def _blocks() -> list[tuple[str, int, bool, str]]:
    """(page, line, fragment, code) of each ```python block."""
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M):
            line = text.count("\n", 0, match.start()) + 1
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            found.append((page, line, before.strip() == "<!-- fragment -->", match[1]))
    return found


BLOCKS = _blocks()
README_QUICKSTART = next(b for b in BLOCKS if b[0] == "README.md")


def test_fragments_are_few_and_parse():
    fragments = [b for b in BLOCKS if b[2]]
    assert 0 < len(fragments) <= len(BLOCKS) // 2, [(page, line) for page, line, *_ in fragments]
    for page, line, _, code in fragments:
        compile(code, f"{page}:{line}", "exec")


@pytest.mark.slow
@pytest.mark.parametrize("page, line, code", [
    (page, line, code) for page, line, fragment, code in BLOCKS
    if not fragment and page not in ELSEWHERE and (page, line) != README_QUICKSTART[:2]])
def test_a_block_runs_as_pasted(page, line, code, tmp_path):
    proc = run_code(code, timeout=300, cwd=tmp_path, check=False)
    assert proc.returncode == 0, f"{page}:{line}\n" + script_failed(proc)
