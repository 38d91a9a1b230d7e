"""Keras's own tests of `fit`, run beneath the trainer: the download, and the pytest plugin each run loads.

Keras's source distribution ships its test files. `keras_test_files` downloads
the one for the installed Keras (once, into `.cache/`) and takes out the files
the tiers run: `keras/src/trainers/trainer_test.py`, `keras/src/callbacks/*_test.py`
and `keras/src/distillation/*_test.py`; the full tier adds `keras/src/models/`
(the functional API, Sequential, cloning) and `keras/src/wrappers/` (the
scikit-learn wrappers under scikit-learn's estimator checks), minutes more.
They are never copied into the repository.

A run of them is `python -m pytest -p keras_plugin FILES` (with this folder on the path) with `KERAS_SUITE_MODE`
set to "plain" (Keras alone) or to a replica count ("1", "2"): then each test
runs inside `with Trainer(strategy=...).distribute():`, as a user's script
would, so every `model.fit`, `evaluate`, `predict` and `*_on_batch` in it runs
on the trainer. Each test's outcome goes to `KERAS_SUITE_RESULTS` as JSON.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "keras-tests"
# The files of Keras's suite that test fit, evaluate, predict and the callbacks, and a model that overrides them
# (distillation); the full tier's, the models' and the wrappers'. The Orbax callback's tests need
# orbax-checkpoint, which neither Keras nor the trainer depends on (they fail on Keras alone here).
MEMBERS = ("keras/src/trainers/trainer_test.py", "keras/src/callbacks/", "keras/src/distillation/")
FULL_MEMBERS = ("keras/src/models/", "keras/src/wrappers/")
LEFT_OUT = ("keras/src/callbacks/orbax_checkpoint_test.py",)


def suite_release(version: str) -> str:
    """The Keras release whose tests run on Keras `version`: that release, or for a nightly or a pre-release
    (whose source distribution ships no tests) the newest release of an earlier minor version, as a pip
    requirement's bound ("<3.16")."""
    release = re.fullmatch(r"(\d+)\.(\d+)\.\d+", version)
    if release:
        return version
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return f"<{major}.{minor}"


def keras_test_files(version: str, *, full: bool = False) -> list[Path]:
    """The test files of Keras `version`'s source distribution that the tier runs (`full`: the full tier's),
    downloaded once for every member listed; for a nightly, those of the release before it (`suite_release`)."""
    release = suite_release(version)
    folder = CACHE / release.replace("<", "before-")
    requirement = f"keras=={release}" if release[0].isdigit() else f"keras{release}"
    members = MEMBERS + FULL_MEMBERS
    if not (folder / "done").exists() or (folder / "done").read_text() != "\n".join(members):
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "--dest", str(folder), requirement], check=True)
        (archive,) = folder.glob("keras-*.tar.gz")
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                path = member.name.split("/", 1)[-1]
                if (member.isfile() and path.endswith("_test.py") and path.startswith(members)
                        and path not in LEFT_OUT):
                    member.name = _folder(path) + "/" + path.rsplit("/", 1)[-1]  # trainers/x_test.py
                    tar.extract(member, folder, filter="data")
        archive.unlink()
        (folder / "done").write_text("\n".join(members))
    folders = {_folder(member) for member in MEMBERS + (FULL_MEMBERS if full else ())}
    return sorted(path for path in folder.glob("*/*_test.py") if path.parent.name in folders)


def _folder(path: str) -> str:
    """"keras/src/trainers/trainer_test.py" and "keras/src/callbacks/" -> "trainers", "callbacks"."""
    parts = path.rstrip("/").split("/")
    return parts[-2] if parts[-1].endswith(".py") else parts[-1]


# The plugin ------------------------------------------------------------------------

_MODE = os.environ.get("KERAS_SUITE_MODE", "plain")
_outcomes: dict[str, str] = {}
_trainer = None


def pytest_configure(config):
    # Keras's root conftest.py registers these; the source distribution leaves it out.
    config.addinivalue_line("markers", "requires_trainable_backend: Keras's marker")
    config.addinivalue_line("markers", "multi_device: Keras's marker")
    import keras  # noqa: F401  (first: Keras asks whether JAX is there as it imports)
    import tensorflow as tf

    try:
        import jax  # noqa: F401
    except ImportError:
        # trainer_test.py imports jax at its top and uses it only on the JAX backend.
        sys.modules["jax"] = types.ModuleType("jax")

    _renamed_trainers()
    if _MODE != "plain":
        replicas = int(_MODE)
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)


def _renamed_trainers() -> None:
    """Keras 3.16 renamed the classes the tests of earlier releases import (TensorFlowTrainer is the backend's
    `Trainer`, trainers/trainer.py's `Trainer` is `BaseTrainer`): the old names are given back for these runs,
    both modes alike, so that those tests run on a nightly rather than fail to import."""
    from keras.src.backend.tensorflow import trainer as backend
    from keras.src.trainers import trainer as base

    if not hasattr(backend, "TensorFlowTrainer") and hasattr(base, "BaseTrainer"):
        backend.TensorFlowTrainer = backend.Trainer
        base.Trainer = base.BaseTrainer


def _the_trainer():
    global _trainer
    if _trainer is None:
        from trainer import Trainer

        _trainer = Trainer() if _MODE == "1" else Trainer(strategy="mirrored")  # "auto": one device here
    return _trainer


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if _MODE == "plain":
        yield
        return
    with _the_trainer().distribute():
        yield


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        if report.nodeid not in _outcomes or _outcomes[report.nodeid] == "passed":
            _outcomes[report.nodeid] = report.outcome


def pytest_sessionfinish(session):
    path = os.environ.get("KERAS_SUITE_RESULTS")
    if path:
        Path(path).write_text(json.dumps(_outcomes, indent=1, sort_keys=True))
