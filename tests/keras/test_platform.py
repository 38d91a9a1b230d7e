"""Outside the tested versions, or with a hook's target gone, the trainer refuses; with the opt-in it trains, and
the plan says what is no longer guaranteed (tests/scripts/platform_run.py, in fresh interpreters)."""

import pytest

from conftest import run_python, SCRIPTS
from trainer._compat.patches import UNTESTED_OPT_IN, Patches

SCRIPT = SCRIPTS / "platform_run.py"
OPT_IN = {UNTESTED_OPT_IN: "1"}


@pytest.mark.parametrize("mode, found", [
    ("newer", "Found: Keras 3.16.0 (tested 3.8-3.15)."),
    ("moved", "Found: no `_all_reduce_sum_gradients` of TFOptimizer (keras/src/backend/tensorflow/optimizer.py)."),
])
def test_an_untested_platform_is_refused_before_anything_changes(mode, found):
    result = run_python(SCRIPT, mode, "2")
    assert found in result["refused"]
    assert f"or set {UNTESTED_OPT_IN}=1 to train anyway" in result["refused"]
    assert not result["weights_changed"] and "Training plan" not in result["plan"]


@pytest.mark.parametrize("mode, note", [
    ("newer", "Keras 3.16.0 (tested 3.8-3.15); every hook is in place;"),
    ("moved", "without hooks for the replicas' loss and gradient shares"),
])
def test_with_the_opt_in_it_trains_and_the_plan_says_what_is_not_guaranteed(mode, note):
    result = run_python(SCRIPT, mode, "2", env=OPT_IN)
    assert result["refused"] is None and result["weights_changed"]
    versions = [line for line in result["plan"].splitlines() if line.strip().startswith("versions")]
    assert len(versions) == 1 and note in versions[0], result["plan"]
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
