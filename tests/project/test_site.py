"""The documentation site (mkdocs.yml; CI builds it with `mkdocs build --strict`, .ci/test) leaves nothing out: the
API page documents every public name, and the navigation lists every page. Read from the sources, without
importing the package: a name added to `trainer.__all__` or a page added to docs/ fails here until it is shown."""

import ast
import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parent.parent.parent


def _assigned(path: Path, name: str):
    """The literal value a module assigns to `name` at its top level."""
    tree = ast.parse(path.read_text())
    return next(ast.literal_eval(node.value) for node in tree.body
                if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets))


def test_the_api_page_documents_every_public_name():
    public = {f"trainer.{name}" for name in _assigned(ROOT / "trainer" / "__init__.py", "_EXPORTS")}  # __all__'s keys
    public |= {f"trainer.callbacks.{name}" for name in _assigned(ROOT / "callbacks" / "__init__.py", "__all__")}
    documented = re.findall(r"^::: (\S+)$", (ROOT / "docs" / "api.md").read_text(), re.M)
    assert sorted(documented) == sorted(public)


class _Loader(yaml.SafeLoader):
    """mkdocs.yml's `!!python/...` values (a function for the anchors) read as None: only the nav matters here."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)


def _nav_pages(nav) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    items = nav.values() if isinstance(nav, dict) else nav
    return [page for item in items for page in _nav_pages(item)]


def test_every_page_is_in_the_navigation():
    nav = _nav_pages(yaml.load((ROOT / "mkdocs.yml").read_text(), _Loader)["nav"])
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages <= set(nav), f"pages missing from mkdocs.yml's nav: {sorted(pages - set(nav))}"
    assert {"index.md", "changelog.md"} <= set(nav)  # the README and CHANGELOG.md (docs/hooks.py)


@pytest.fixture(scope="module")
def hooks():
    pytest.importorskip("mkdocs")
    spec = importlib.util.spec_from_file_location("site_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("text, target, source, page, expected", [
    # The README is the site's index.md: its links into docs/ lose the folder.
    ("docs/x.md", "docs/x.md#a", "README.md", "index.md", "[docs/x.md](x.md#a)"),
    ("changes", "CHANGELOG.md", "README.md", "index.md", "[changes](changelog.md)"),
    ("by hand", "../README.md#set-up-by-hand", "docs/testing.md", "testing.md", "[by hand](index.md#set-up-by-hand)"),
    ("design", "../design.md", "docs/contributors/lab_notes.md", "contributors/lab_notes.md",
     "[design](../design.md)"),
    # A repository file the site has no page for: its path, as code.
    ("bench/README.md", "../bench/README.md", "docs/performance.md", "performance.md", "`bench/README.md`"),
    ("the soak", "../tests/launch/test_soak.py", "docs/reliability.md", "reliability.md",
     "the soak (`tests/launch/test_soak.py`)"),
    ("#4290", "https://github.com/horovod/horovod/issues/4290", "README.md", "index.md",
     "[#4290](https://github.com/horovod/horovod/issues/4290)"),
])
def test_links_written_for_github_work_on_the_site(hooks, text, target, source, page, expected):
    assert hooks._site_link(text, target, source, page) == expected
