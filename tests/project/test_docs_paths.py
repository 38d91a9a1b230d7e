"""What the code's docstrings and comments, docs/ and the README point at exists: the repository's files, the
files of Keras and TensorFlow that `_compat` names, and the trainer's modules and names written `module.name`.

A folder move or a rename leaves such pointers behind without breaking any other test."""

import importlib
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
FOLDERS = ("trainer", "callbacks", "tests", "bench", "examples", "docs", "notebooks", ".ci")
# Installed packages whose files `_compat` names by their path in the package.
PACKAGES = {"keras": "keras", "tensorflow": "tensorflow", "grain": "grain"}
# First words that are variables in prose (a strategy's `strategy.run`, a history's `history.plot`), not modules.
VARIABLES = {"strategy", "history", "plan", "route", "objective", "optimizer", "context"}

_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w-]+\.(?:py|md|sh|cfg|ipynb))\b")
_DOTTED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)[`(]")
_BARE = re.compile(r"`([\w-]+\.py)`")


def _files(*where: str) -> list[str]:
    return subprocess.run(["git", "ls-files", *where], capture_output=True, text=True, cwd=ROOT,
                          check=True).stdout.split()


def _texts() -> list[tuple[str, str]]:
    return [(f, (ROOT / f).read_text()) for f in _files("trainer", "callbacks", "docs", "README.md", "bench/README.md")
            if f.endswith((".py", ".md"))]


def _package_root(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return None if spec is None or not spec.submodule_search_locations else Path(spec.submodule_search_locations[0])


def _newest() -> bool:
    """Whether Keras and TensorFlow are the newest that CI tests, which every file `_compat` names has (some are
    newer than the floor: Keras's grain adapter)."""
    from trainer._compat.version import TESTED, installed

    return all(installed()[name][1] == high for name, (_, high) in TESTED.items())


def _path_exists(path: str) -> bool | None:
    """Whether a path written in the text exists: in the repository, or in the installed package it names,
    at the newest versions CI tests (None: not checked here; Keras's `*_test.py` are in its source
    distribution only, not in what pip installs)."""
    first = path.split("/")[0]
    if first in FOLDERS:
        return (ROOT / path).exists()
    if first in PACKAGES and _newest() and not path.endswith("_test.py"):
        root = _package_root(PACKAGES[first])
        return None if root is None else (root.parent / path).exists()
    return None


def test_every_path_written_exists():
    missing = []
    for name, text in _texts():
        for line in text.splitlines():
            if "--out" in line:  # a benchmark's output, written when it runs
                continue
            for path in _PATH.findall(line):
                if _path_exists(path) is False:
                    missing.append(f"{name}: {path}")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_every_module_file_the_code_names_exists():
    """A bare `module.py` in the product's code is one of the repository's files."""
    names = {os.path.basename(f) for f in _files()}
    missing = [f"{name}: {file}" for name, text in _texts() if name.endswith(".py")
               for file in _BARE.findall(text) if file not in names]
    assert not missing, "module files that do not exist:\n" + "\n".join(missing)


def _modules() -> dict[str, list[str]]:
    """A module's file name -> the import names of the trainer's modules with that name."""
    found: dict[str, list[str]] = {"_compat": ["trainer._compat"]}
    for f in _files("trainer", "callbacks"):
        if f.endswith(".py") and not f.endswith(("__init__.py", "__main__.py")):
            dotted = f[:-3].replace("/", ".")
            found.setdefault(Path(f).stem, []).append("trainer." + dotted if f.startswith("callbacks/") else dotted)
    return found


def _resolves(module: str, names: list[str]) -> bool:
    obj = importlib.import_module(module)
    for name in names:
        if hasattr(obj, name):
            obj = getattr(obj, name)
            continue
        try:
            obj = importlib.import_module(f"{obj.__name__}.{name}")
        except (ImportError, AttributeError):
            return False
    return True


def test_every_module_name_written_exists():
    """`feed.share_of`, `_compat.replicas.batch_norm.compute_moments_sync`, `trainer.engine.malloc`: each a name
    the module has, wherever the name of the module is one module's (`checks` is two: it is not read)."""
    pytest.importorskip("trainer")
    import trainer
    from trainer import Trainer

    modules, missing = _modules(), []
    for name, text in _texts():
        for written in _DOTTED.findall(text):
            first, *rest = written.split(".")
            if rest[-1] in ("py", "md", "json", "sh", "cfg"):  # a file (`test_every_path_written_exists`)
                continue
            if first == "trainer":
                if name.endswith(".md"):  # the docs name their Trainer instance `trainer`...
                    if rest[0] in trainer.__all__ and not hasattr(Trainer, rest[0]):  # ...so the package's
                        missing.append(f"{name}: {written} (not a Trainer's: import it by name from trainer)")
                    continue
                if not (_resolves("trainer", rest) or hasattr(Trainer, rest[0])):
                    missing.append(f"{name}: {written}")
            elif first not in VARIABLES and len(modules.get(first, ())) == 1:
                if not _resolves(modules[first][0], rest):
                    missing.append(f"{name}: {written}")
    assert not missing, "names that do not exist:\n" + "\n".join(missing)
