"""The folders of `trainer/` stand in layers, each importing only what stands below it (docs/design.md, and each
folder's `__init__.py`): read from the code's imports, so that a new import that runs back up fails here."""

import ast
from pathlib import Path

ROOT = Path(__file__).parent.parent.parent

# From the ground up. A module may import its own folder and any layer below its own.
LAYERS = [
    {"trainer.quiet", "trainer.scaling", "trainer.user_line"},
    {"trainer._compat"},
    {"trainer.distribute"},
    {"trainer.data"},
    {"trainer.model"},
    {"trainer.engine"},
    {"trainer.launch", "trainer.callbacks"},
    {"trainer.checks", "trainer.options", "trainer.history", "trainer.calls", "trainer.strategies"},
    {"trainer.stages", "trainer.batching"},
    {"trainer.runs"},
    {"trainer.trainer", "trainer"},
    {"trainer.check"},
]


def _unit(module: str) -> str:
    """`trainer.data.feed` -> `trainer.data`; a top-level module is its own unit."""
    return ".".join(module.split(".")[:2])


def _layer(unit: str) -> int:
    found = [i for i, layer in enumerate(LAYERS) if unit in layer]
    assert found, f"{unit} stands on no layer: add it to LAYERS in tests/project/test_layers.py and to docs/design.md"
    return found[0]


def _imports(path: Path, module: str):
    """(line, the trainer module imported) for every import of the trainer in `path`, however deep in a function."""
    package_of_path = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            package = package_of_path.rsplit(".", node.level - 1)[0] if node.level > 1 else package_of_path
            base = f"{package}.{node.module}" if node.module else package
            yield from ((node.lineno, f"{base}.{a.name}" if not node.module else base) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "trainer":
            if node.module == "trainer":  # `from trainer import data` names a module; `import Trainer` the facade
                yield from ((node.lineno, f"trainer.{a.name}") for a in node.names)
            else:
                yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "trainer")


def _sources():
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    for path in sorted((ROOT / "callbacks").rglob("*.py")):
        parts = ("trainer",) + path.relative_to(ROOT).with_suffix("").parts
        yield path, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_import_of_the_trainer_runs_down_or_within_its_folder():
    upward = []
    for path, module in _sources():
        here = _unit(module)
        for line, imported in _imports(path, module):
            there = _unit(imported)
            if there == here:
                continue
            if _layer(there) >= _layer(here):
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert not upward, "imports that run back up or sideways between folders:\n" + "\n".join(upward)


def test_each_folder_says_what_it_is_for_and_what_it_may_import():
    for init in sorted((ROOT / "trainer").glob("*/__init__.py")):
        text = ast.get_docstring(ast.parse(init.read_text())) or ""
        if init.parent.name == "_compat":
            assert text, init
            continue
        assert "May import" in text and "Imported by" in text, f"{init.relative_to(ROOT)}: {text[:200]!r}"


def test_the_layers_catch_an_import_that_runs_back_up(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from trainer.engine.loop import run_epochs\n")
    imported = [m for _, m in _imports(bad, "trainer.data.bad")]
    assert imported == ["trainer.engine.loop"]
    assert _layer(_unit(imported[0])) > _layer(_unit("trainer.data.bad"))
