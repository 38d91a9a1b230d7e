"""Outside the tested versions, or with a hook's target gone, every entry refuses before anything runs; with the
opt-in it trains, and the plan says what is no longer guaranteed, except without the route to the trainer's steps,
which no opt-in replaces (tests/scripts/platform_run.py, in fresh interpreters). This file runs in every tier."""

import functools

import pytest

from conftest import run_python, SCRIPTS
from trainer._compat.patches import UNTESTED_OPT_IN, Patches
from trainer._compat.version import TESTED

SCRIPT = SCRIPTS / "platform_run.py"
OPT_IN = {UNTESTED_OPT_IN: "1"}
KERAS = "{0[0]}.{0[1]}-{1[0]}.{1[1]}".format(*TESTED["Keras"])
ENTRIES = ("fit", "evaluate", "predict", "distribute: fit", "distribute: evaluate", "distribute: predict",
           "distribute: train_on_batch", "distribute: test_on_batch", "distribute: predict_on_batch")
ROUTE = "keras/src/backend/tensorflow/trainer.py"


@pytest.mark.parametrize("mode, found, opt_in", [
    ("newer", f"Found: Keras 3.17.0 (tested {KERAS}).", f"or set {UNTESTED_OPT_IN}=1 to train anyway"),
    ("moved", "Found: no `_all_reduce_sum_gradients` of TFOptimizer (keras/src/backend/tensorflow/optimizer.py).",
     f"or set {UNTESTED_OPT_IN}=1 to train anyway"),
    ("route", f"of {ROUTE}", f"{UNTESTED_OPT_IN}=1 can't stand in for a missing route"),
])
def test_every_entry_refuses_an_untested_platform_before_anything_runs(mode, found, opt_in):
    results = run_python(SCRIPT, mode, "2")
    assert sorted(results) == sorted(ENTRIES)
    for entry, result in results.items():
        assert result["refused"] and found in result["refused"] and opt_in in result["refused"], (entry, result)
        assert f"Keras {KERAS}" in result["refused"] or f"tested {KERAS}" in result["refused"], (entry, result)
        assert not result["weights_changed"] and not result["model_called"], entry
        assert "Training plan" not in result["plan"], entry


def test_without_the_route_no_opt_in_trains_and_keras_loop_never_runs():
    for entry, result in run_python(SCRIPT, "route", "2", env=OPT_IN).items():
        assert result["refused"] and ROUTE in result["refused"] and "Nothing has run" in result["refused"], entry
        assert not result["weights_changed"] and not result["model_called"], entry


@pytest.mark.parametrize("mode, note", [
    ("newer", f"Keras 3.17.0 (tested {KERAS}); every hook is in place;"),
    ("moved", "without hooks for the replicas' loss and gradient shares"),
])
def test_with_the_opt_in_it_trains_and_the_plan_says_what_is_not_guaranteed(mode, note):
    results = run_python(SCRIPT, mode, "2", env=OPT_IN)
    for entry, result in results.items():
        assert result["refused"] is None, (entry, result)
    fit = results["fit"]
    assert fit["weights_changed"] and fit["model_called"]
    assert results["distribute: fit"]["weights_changed"] and results["distribute: train_on_batch"]["weights_changed"]
    versions = [line for line in fit["plan"].splitlines() if line.strip().startswith("versions")]
    assert len(versions) == 1 and note in versions[0], fit["plan"]
    assert versions[0].endswith("the numbers are not guaranteed to be one device's")


class _Owner:
    present = staticmethod(lambda: "kept")


def test_a_hook_whose_target_is_gone_names_it_and_installs_nothing(monkeypatch):
    originals = {}
    patches = Patches("a test's hooks", [("present", _Owner, "present", lambda: "hooked", "tests: _Owner"),
                                         ("gone", _Owner, "gone", lambda: "hooked", "tests: _Owner.gone")], originals)
    Patches.registry.remove(patches)  # not one of the trainer's
    assert patches.missing() == ["`gone` of tests: _Owner.gone"]
    with pytest.raises(RuntimeError, match=r"hooks for a test's hooks need `gone` of tests: _Owner.gone"):
        with patches.installed():
            pass
    monkeypatch.setenv(UNTESTED_OPT_IN, "1")
    with patches.installed():
        assert _Owner.present() == "kept" and originals == {}  # Keras's own functions run
    assert _Owner.present() == "kept"


class _Distribution:
    def __init__(self, name):
        self.version = {"keras": "3.15.1", "keras-nightly": "3.16.0.dev2026102704"}[name]

    def read_text(self, name):
        return "keras/__init__.py,sha256=x,10\n" if name == "RECORD" else None


def test_keras_written_by_two_distributions_is_refused_with_the_fix(monkeypatch):
    from trainer._compat import platform, version

    monkeypatch.setattr(version.metadata, "distribution", _Distribution)
    # Read once per process: a cache of its own reads the faked distributions, and the process's is kept.
    monkeypatch.setattr(version, "keras_owners", functools.lru_cache(version.keras_owners.__wrapped__))
    assert version.keras_owners() == ("keras 3.15.1", "keras-nightly 3.16.0.dev2026102704")
    with pytest.raises(RuntimeError, match=r"Found: .*the keras package written by keras 3\.15\.1 and keras-nightly "
                                           r"3\.16\.0\.dev2026102704, one over the other \(pip uninstall -y keras "
                                           r"keras-nightly"):
        platform.check()
    monkeypatch.setenv(UNTESTED_OPT_IN, "1")
    assert "the keras package written by keras 3.15.1 and keras-nightly" in platform.check()
