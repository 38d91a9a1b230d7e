"""TensorFlow's guide pattern trains through the trainer: a model built and compiled in the user's `with
strategy.scope():`, called inside that scope or after it, with the Trainer's own strategy or the user's strategy
object (one Trainer per strategy, or one given each strategy per call), then restored with `keras.models.load_model`
in a new MirroredStrategy's scope and trained again (tests/scripts/scope_run.py). Every variant gives model.fit's
numbers on one device. Strategies over the same devices run one after another in any order
(tests/scripts/user_strategies_run.py), and a model built in a strategy's scope trains on it under "auto", as under
model.fit."""

import keras
import numpy as np
import pytest

from conftest import mirrored, run_python, SCRIPTS, tiny_data, tiny_model
from trainer import Trainer

SCRIPT = SCRIPTS / "scope_run.py"


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
@pytest.mark.parametrize("runner,where", [("own", "inside"), ("own", "after"), ("user", "inside"), ("user", "after"),
                                          ("shared", "inside")])
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


class StrategySeen(keras.callbacks.Callback):
    """Records the strategy each call ran on, as the trainer tells its callbacks."""

    def __init__(self, seen: list):
        super().__init__()
        self.seen = seen

    def set_trainer_context(self, context):
        self.seen.append(context.strategy)


def test_auto_inside_a_users_scope_takes_that_strategy():
    x, y, _ = tiny_data()
    users = mirrored(2)
    seen = []
    with users.scope():
        model = tiny_model()
        Trainer(verbose=0).fit(model, x, y, callbacks=[StrategySeen(seen)])
    assert seen == [users]


def test_auto_takes_the_strategy_a_model_was_built_in_as_model_fit_does():
    # keras.io's guide builds the model in a strategy's scope and fits after it: model.fit runs on that strategy.
    x, y, _ = tiny_data()
    users = mirrored(2)
    with users.scope():
        model = tiny_model()
    seen = []
    Trainer(verbose=0).fit(model, x, y, callbacks=[StrategySeen(seen)])
    assert seen == [users]
    Trainer(strategy=mirrored(3), verbose=0).fit(model, x, y, callbacks=[StrategySeen(seen)])  # a given one wins
    assert seen[1] is not users and seen[1].num_replicas_in_sync == 3


@pytest.mark.slow
@pytest.mark.parametrize("first,second", [("trainer-predict", "trainer"), ("keras-fit", "trainer"),
                                          ("trainer-fit", "keras")])
def test_strategies_over_the_same_devices_run_one_after_another_in_any_order(first, second):
    # Each MirroredStrategy numbers its collectives from the same keys; the trainer gives one it runs on before
    # its first collective keys of its own. Before, a trainer's fit after its predict on another strategy aborted
    # ("Collective instance 100 expected type 2 and data_type 3 but got type 0 and data_type 1").
    script = SCRIPTS / "user_strategies_run.py"
    result = run_python(script, first, second)
    run = result["second"]
    # The trainer gives model.fit's numbers on one device; Keras's own fit, those it gives with no run before it.
    want = result["one_device"] if second == "trainer" else run_python(script, "none", "keras")["second"]
    assert list(run["history"]) == list(want["history"])
    for key, values in want["history"].items():
        np.testing.assert_allclose(run["history"][key], values, rtol=1e-5, err_msg=key)
    for a, b in zip(run["weights"], want["weights"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
