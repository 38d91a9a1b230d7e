"""Batch and learning-rate rules: pure functions first, then the LR a real fit applies."""

import math

import keras
import numpy as np
import pytest

from conftest import mirrored, tiny_data, tiny_model
from trainer import ScaledSchedule, Trainer
from trainer import scaling


def test_global_batch_is_per_replica_times_replicas():
    plan = scaling.plan_batch(per_replica_batch_size=64, batch_size=None, num_replicas=4)
    assert (plan.global_batch_size, plan.per_replica_batch_size) == (256, 64)


def test_fixed_global_batch_is_split_over_replicas():
    plan = scaling.plan_batch(per_replica_batch_size=None, batch_size=100, num_replicas=3)
    assert (plan.global_batch_size, plan.per_replica_batch_size) == (100, 34)


def test_batch_below_replica_count_leaves_replicas_empty():
    # model.fit takes batch_size=1 on any strategy: two replicas of four get an example, two get none.
    plan = scaling.plan_batch(per_replica_batch_size=None, batch_size=2, num_replicas=4)
    assert (plan.global_batch_size, plan.per_replica_batch_size) == (2, 1)


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_linear_and_sqrt_factors(replicas):
    assert scaling.lr_factor("linear", 64 * replicas, 64) == pytest.approx(replicas)
    assert scaling.lr_factor("sqrt", 64 * replicas, 64) == pytest.approx(math.sqrt(replicas))
    assert scaling.lr_factor(None, 64 * replicas, 64) == 1.0


def test_auto_rule_is_linear_for_sgd_and_sqrt_for_adaptive():
    assert scaling.resolve_lr_rule("auto", keras.optimizers.SGD()) == "linear"
    assert scaling.resolve_lr_rule("auto", keras.optimizers.Adam()) == "sqrt"
    assert scaling.resolve_lr_rule("auto", keras.optimizers.RMSprop()) == "sqrt"
    # What compile makes of a float16 model's optimizer: judged by the one inside.
    assert scaling.resolve_lr_rule("auto", keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())) == "linear"
    assert scaling.resolve_lr_rule("auto", keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())) == "sqrt"


def test_warmup_ramps_from_base_to_scaled():
    factor = 4.0
    assert scaling.warmup_multiplier(0, 10, factor) == pytest.approx(0.25)  # base LR
    assert scaling.warmup_multiplier(5, 10, factor) == pytest.approx(0.625)
    assert scaling.warmup_multiplier(10, 10, factor) == 1.0
    assert scaling.warmup_multiplier(99, 0, factor) == 1.0


def test_scaled_schedule_wraps_a_schedule_and_round_trips():
    inner = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    schedule = ScaledSchedule(inner, factor=2.0, warmup_steps=4)
    for step in (0, 2, 4, 20):
        expected = float(inner(step)) * 2.0 * scaling.warmup_multiplier(step, 4, 2.0)
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert float(clone(3)) == pytest.approx(float(schedule(3)), rel=1e-6)


class _RecordLR(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.seen = getattr(self, "seen", []) + [float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))]


def _lrs_during_fit(replicas, rule, optimizer, warmup_steps=0, schedule=False):
    x, y, w = tiny_data(64 * 4 * 6)
    model = tiny_model(lr=0.01, optimizer=optimizer)
    if schedule:
        model.optimizer = type(model.optimizer)(
            learning_rate=keras.optimizers.schedules.ExponentialDecay(0.01, decay_steps=1000, decay_rate=1.0)
        )
    trainer = Trainer(strategy=mirrored(replicas), per_replica_batch_size=16, lr_scaling=rule,
                      warmup_steps=warmup_steps, verbose=0)
    recorder = _RecordLR()
    history = trainer.fit(model, (x, y), epochs=1, callbacks=[recorder])
    return recorder.seen, history


@pytest.mark.parametrize("replicas", [1, 2, 4])
@pytest.mark.parametrize("rule, optimizer, expected", [
    ("linear", "sgd", lambda r: 0.01 * r),
    ("sqrt", "adam", lambda r: 0.01 * math.sqrt(r)),
    ("auto", "sgd", lambda r: 0.01 * r),
    ("auto", "adam", lambda r: 0.01 * math.sqrt(r)),
])
@pytest.mark.slow
def test_fit_applies_scaled_lr(replicas, rule, optimizer, expected):
    seen, history = _lrs_during_fit(replicas, rule, optimizer)
    np.testing.assert_allclose(seen, expected(replicas), rtol=1e-6)
    assert "learning_rate" not in history.history  # Keras's keys
    assert float(history.model.optimizer.learning_rate.numpy()) == pytest.approx(0.01)  # as tuned, after the fit


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize("schedule", [False, True], ids=["float", "schedule"])
def test_warmup_goes_linearly_from_base_to_scaled_lr(replicas, schedule):
    warmup = 4
    seen, history = _lrs_during_fit(replicas, "linear", "sgd", warmup_steps=warmup, schedule=schedule)
    expected = [0.01 * replicas * scaling.warmup_multiplier(s, warmup, replicas) for s in range(warmup + 1)]
    np.testing.assert_allclose(seen[: warmup + 1], expected, rtol=1e-5)
    np.testing.assert_allclose(seen[-1], 0.01 * replicas, rtol=1e-6)


@pytest.mark.slow
def test_float_lr_stays_settable_after_scaling():
    x, y, w = tiny_data(256)
    model = tiny_model(lr=0.01)
    Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0).fit(model, (x, y), epochs=1)
    history = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0).fit(
        model, (x, y), epochs=1, callbacks=[keras.callbacks.LearningRateScheduler(lambda e, lr: 0.003)]
    )
    assert history.history["learning_rate"] == [pytest.approx(0.003)]  # LearningRateScheduler's own key
