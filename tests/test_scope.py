"""TensorFlow's guide pattern trains through the trainer: a model built and compiled in the user's
`with strategy.scope():`, called inside that scope or after it, with the Trainer's own strategy or the user's
strategy object, then restored with `keras.models.load_model` in a new MirroredStrategy's scope and trained again
(tests/scope_run.py). Every variant gives model.fit's numbers on one device."""

import keras
import numpy as np
import pytest

from conftest import TESTS, mirrored, run_python, tiny_data, tiny_model
from trainer import Trainer

SCRIPT = TESTS / "scope_run.py"


def _assert_same_runs(runs, reference):
    assert len(runs) == len(reference) == 3
    for run, want in zip(runs, reference):
        assert list(run["history"]) == list(want["history"])
        for key, values in want["history"].items():
            np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, err_msg=key)
        for key in ("evaluate", "weights"):
            if key in want:
                np.testing.assert_allclose(run[key], want[key], rtol=1e-5)


@pytest.fixture(scope="module")
def reference():
    return run_python(SCRIPT, "1", "keras", "inside")


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [pytest.param(1, marks=pytest.mark.full), 2])  # 1: the full tier's
@pytest.mark.parametrize("runner", ["own", "user"])
@pytest.mark.parametrize("where", ["inside", "after"])
def test_the_guides_pattern_gives_model_fits_numbers(reference, replicas, runner, where):
    _assert_same_runs(run_python(SCRIPT, str(replicas), runner, where), reference)


def test_another_strategy_inside_a_users_scope_is_refused_before_anything_runs():
    x, y, _ = tiny_data()
    users = mirrored(2)
    with users.scope():
        model = tiny_model()
        before = [w.copy() for w in model.get_weights()]
        with pytest.raises(ValueError, match=r"strategy whose scope this call sits in.*Trainer\(strategy=strategy\)"):
            Trainer(strategy=mirrored(2), verbose=0).fit(model, x, y)
        with pytest.raises(ValueError, match="strategy whose scope"):
            Trainer(strategy="one_device", verbose=0).evaluate(model, x, y)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_auto_inside_a_users_scope_takes_that_strategy():
    x, y, _ = tiny_data()
    users = mirrored(2)
    seen = []

    class Seen(keras.callbacks.Callback):
        def set_trainer_context(self, context):
            seen.append(context.strategy)

    with users.scope():
        model = tiny_model()
        Trainer(verbose=0).fit(model, x, y, callbacks=[Seen()])
    assert seen == [users]
