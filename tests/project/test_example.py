"""The Fashion-MNIST example end to end on generated IDX files, its IDX reader, and the notebook."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from conftest import script_failed, TESTS
from trainer.quiet import is_startup_notice

EXAMPLES = TESTS.parent / "examples"
sys.path.insert(0, str(EXAMPLES))

import fashion_mnist  # noqa: E402
import idx  # noqa: E402


@pytest.fixture(scope="module")
def idx_dir(tmp_path_factory):
    """The four standard files, in the real format, with generated images."""
    directory = tmp_path_factory.mktemp("fashion")
    for split, n in (("train", 320), ("test", 80)):
        images, labels = fashion_mnist.synthetic_images(n, seed=0, split=int(split == "test"))
        idx.write_idx(directory / idx.FILES[f"{split}_images"], images)
        idx.write_idx(directory / idx.FILES[f"{split}_labels"], labels)
    return directory


def test_idx_round_trip(idx_dir):
    (x_train, y_train), (x_test, y_test) = idx.load_dataset(idx_dir)
    assert x_train.shape == (320, 28, 28) and x_train.dtype == np.uint8 and y_test.shape == (80,)
    expected, _ = fashion_mnist.synthetic_images(320, seed=0, split=0)
    np.testing.assert_array_equal(x_train, expected)


@pytest.mark.parametrize("corrupt, pattern", [
    (lambda raw: b"\x00\x00\x08\x02" + raw[4:], r"magic number 0x00000802, expected 0x00000803"),
    (lambda raw: b"\x00\x00\x0d\x03" + raw[4:], r"magic number"),
    (lambda raw: raw[:-5], r"data bytes for dimensions \(320, 28, 28\), expected 250880"),
    (lambda raw: raw[:3], r"too short for an IDX header"),
])
def test_idx_reader_names_the_bad_file(tmp_path, idx_dir, corrupt, pattern):
    import gzip
    import shutil

    for name in idx.FILES.values():
        shutil.copy(idx_dir / name, tmp_path / name)
    bad = tmp_path / idx.FILES["train_images"]
    with gzip.open(bad, "rb") as f:
        raw = f.read()
    with gzip.open(bad, "wb") as f:
        f.write(corrupt(raw))
    with pytest.raises(idx.IDXError, match=re.escape(str(bad)) + ".*" + pattern):
        idx.load_dataset(tmp_path)


def test_idx_reader_checks_labels_and_gzip(tmp_path, idx_dir):
    import shutil

    for name in idx.FILES.values():
        shutil.copy(idx_dir / name, tmp_path / name)
    idx.write_idx(tmp_path / idx.FILES["test_labels"], np.full(79, 3, np.uint8))
    with pytest.raises(idx.IDXError, match=r"t10k-labels-idx1-ubyte.gz: 79 labels for 80 images"):
        idx.load_dataset(tmp_path)
    idx.write_idx(tmp_path / idx.FILES["test_labels"], np.full(80, 12, np.uint8))
    with pytest.raises(idx.IDXError, match=r"label 12 is out of range"):
        idx.load_dataset(tmp_path)
    (tmp_path / idx.FILES["test_labels"]).write_bytes(b"not gzip at all")
    with pytest.raises(idx.IDXError, match=r"t10k-labels-idx1-ubyte.gz: can't be read"):
        idx.load_dataset(tmp_path)


def test_offline_without_flags_fails_fast_naming_both(monkeypatch, tmp_path):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))  # nothing cached
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DATA_DIR", str(tmp_path / "not-installed"))
    monkeypatch.setattr(fashion_mnist, "_reachable", lambda host, timeout=3.0: False)
    with pytest.raises(SystemExit, match=r"--data-dir DIR.*dataset-fashion-mnist.*--synthetic N"):
        fashion_mnist.load_raw(None, None, seed=0)


def test_without_flags_the_debian_packages_files_are_used(monkeypatch, tmp_path, idx_dir):
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))  # nothing cached
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DATA_DIR", str(idx_dir))
    monkeypatch.setattr(fashion_mnist, "_reachable", lambda host, timeout=3.0: pytest.fail("tried to download"))
    (x_train, y_train), (x_test, y_test) = fashion_mnist.load_raw(None, None, seed=0)
    expected = idx.load_dataset(idx_dir)
    for got, want in zip((x_train, y_train, x_test, y_test), (*expected[0], *expected[1])):
        np.testing.assert_array_equal(got, want)
    assert x_train.shape == (320, 28, 28) and x_test.shape == (80, 28, 28)


DECOY = "NAME = 'the user\\'s own callbacks.py'\n"  # a user's module next to their copy of the example


def _copy_with_a_decoy(source: Path, names: list[str], target: Path) -> Path:
    """`names` from `source` copied into `target`, beside a user's own callbacks.py."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(source / name, target / name)
    (target / "callbacks.py").write_text(DECOY)
    return target


NO_LOG_LEVEL = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}


def _startup_notices(proc) -> list[str]:
    """TensorFlow's start-up notices in a run's output (none should reach the user)."""
    return [line for line in (proc.stdout + proc.stderr).splitlines()
            if is_startup_notice(line.split("] ", 1)[1] if line.startswith("[") else line)]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_example_end_to_end_on_idx_files(tmp_path, idx_dir, policy):
    out = tmp_path / "out"
    flags = [] if policy == "float32" else ["--mixed-precision", policy]
    project = _copy_with_a_decoy(EXAMPLES, ["fashion_mnist.py", "idx.py"], tmp_path / "project")
    proc = subprocess.run(
        [sys.executable, str(project / "fashion_mnist.py"), "--data-dir", str(idx_dir), "--epochs", "1",
         "--out", str(out), "--strategy", "mirrored", "--cpu-replicas", "2", "--batch", "32", *flags],
        capture_output=True, text=True, timeout=300, env=NO_LOG_LEVEL,
    )
    assert proc.returncode == 0, script_failed(proc)
    assert proc.stdout.startswith("Training plan") and "2 in sync" in proc.stdout
    assert _startup_notices(proc) == []  # as the user sees it, with no TF_CPP_MIN_LOG_LEVEL of their own
    assert re.search(rf"precision +{policy}", proc.stdout)
    printed = float(re.search(r"Test accuracy: ([0-9.]+)", proc.stdout).group(1))
    restored = float(re.search(r"Restored without a strategy: test accuracy ([0-9.]+)", proc.stdout).group(1))

    for name in ("log.csv", "log.jsonl", "curves.png", "results.json", "checkpoints/checkpoints.json",
                 "checkpoints/last.keras", "checkpoints/epoch001.keras"):
        assert (out / name).exists(), name
    # Recompute the accuracy from the saved checkpoint, outside the example.
    (_, _), (x_test, y_test) = idx.load_dataset(idx_dir)
    model = keras.models.load_model(out / "checkpoints" / "last.keras")
    assert {layer.dtype_policy.name for layer in model.layers} == {policy}  # the checkpoint keeps the layers' precision
    logits = model.predict(x_test[..., None].astype("float32") / 255, verbose=0)
    recomputed = float(np.mean(logits.argmax(axis=1) == y_test))
    assert printed == pytest.approx(recomputed, abs=5e-5)
    assert restored == pytest.approx(recomputed, abs=5e-5)
    results = json.loads((out / "results.json").read_text())
    assert results["test_accuracy"] == pytest.approx(recomputed, abs=1e-6)
    with open(out / "log.jsonl") as f:
        assert [json.loads(line)["epoch"] for line in f] == [0]


def _notebook_text(notebook) -> tuple[str, int]:
    """The text the notebook's code cells printed, and how many images they showed."""
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    return "".join(o.get("text", "") for o in outputs), sum("image/png" in o.get("data", {}) for o in outputs)


def test_the_notebook_is_kept_with_the_outputs_of_one_run():
    """`make notebook` (.ci/notebook) keeps it with its outputs, for a reader on GitHub: every code cell run once,
    in order, on the real Fashion-MNIST, with the plan, the accuracy and three images."""
    import nbformat

    notebook = nbformat.read(TESTS.parent / "notebooks" / "quickstart.ipynb", as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), "run `make notebook`"
    text, images = _notebook_text(notebook)
    assert "Training plan" in text and "2 in sync" in text and "Fashion-MNIST: 6000 training" in text
    assert [line for line in text.splitlines() if is_startup_notice(line) or "INFO:tensorflow" in line] == []
    assert "accuracy" in "".join(o.get("data", {}).get("text/plain", "") for c in code for o in c.outputs)
    assert images == 3  # the training images, the predictions, the curves


@pytest.mark.slow
def test_notebook_runs_without_errors(tmp_path):
    """Run from a copy of the repository's layout whose notebooks/ holds a user's own callbacks.py."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(TESTS.parent / "notebooks" / "quickstart.ipynb", as_version=4)
    for cell in notebook.cells:  # a run of its own, from nothing
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    _copy_with_a_decoy(EXAMPLES, ["fashion_mnist.py", "idx.py"], tmp_path / "examples")
    (tmp_path / "examples" / "callbacks.py").unlink()
    notebooks = _copy_with_a_decoy(TESTS.parent / "notebooks", [], tmp_path / "notebooks")
    client = NotebookClient(notebook, timeout=240, kernel_name="python3",
                            resources={"metadata": {"path": str(notebooks)}})
    client.execute()  # raises CellExecutionError on any cell error
    text, images = _notebook_text(notebook)
    assert "Training plan" in text and "2 in sync" in text
    assert [line for line in text.splitlines() if is_startup_notice(line) or "INFO:tensorflow" in line] == []
    real = fashion_mnist.real_data_available()
    assert ("Fashion-MNIST: 6000 training and 10000 test images" in text) == real, text[:500]
    assert ("generated images" in text) != real
    assert images == 3  # the training images, the predictions, the curves
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)  # tqdm widget


@pytest.mark.slow
def test_example_runs_unchanged_under_the_launcher(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.launch", "--workers", "2", str(EXAMPLES / "fashion_mnist.py"),
         "--synthetic", "400", "--epochs", "1", "--batch", "32", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=NO_LOG_LEVEL,
    )
    assert proc.returncode == 0, script_failed(proc)
    assert proc.stdout.startswith("[worker:0] Training plan") and _startup_notices(proc) == []
    assert "[worker:0]   replicas       2 in sync over 2 worker(s)" in proc.stdout
    assert "[worker:0] Restored without a strategy" in proc.stdout
    assert "[worker:1] Test accuracy" not in proc.stdout
    assert json.loads((out / "results.json").read_text())["epochs"] == 1
