"""fit's stages (trainer/stages.py), each called on its own."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer import Plan, Trainer, calls, stages

PLAN = dict(
    strategy="MirroredStrategy", num_replicas=2, num_workers=1, global_batch_size=64, per_replica_batch_size=32,
    num_examples=1003, steps_per_epoch=16, shard_policy="OFF", shard_reason="trainer-sharded", lr_rule="linear",
    base_lr="0.1", scaled_lr="0.2", base_batch_size=32, warmup_steps=0, steps_per_execution=16, jit_compile=False,
)


def _call(**kwargs):
    arguments = dict(batch_size=None, validation_split=0.0, validation_freq=1, validation_batch_size=None,
                     validation_steps=None, class_weight=None, epochs=1, initial_epoch=0, steps_per_epoch=None,
                     shuffle=True, verbose=1)
    return stages.checked_fit_call(None, tf.distribute.get_strategy(), **{**arguments, **kwargs})


def test_the_call_is_read_as_keras_reads_it(monkeypatch):
    monkeypatch.delenv("TRAINER_BACKUP_DIR", raising=False)  # no launcher: no backup joins the callbacks
    call = _call(batch_size=16, epochs=3, initial_epoch=1, steps_per_epoch=0, validation_steps=0, verbose="auto")
    assert call == calls.FitCall(callbacks=[], epochs=3, initial_epoch=1, steps_per_epoch=None, shuffle=True,
                                  verbose=1, validation_steps=None, validation_freq=1, validation_batch_size=16)


def test_the_call_is_refused_before_the_data_is_read():
    with pytest.raises(TypeError, match="epochs=2.5"):
        _call(epochs=2.5)
    with pytest.raises(ValueError, match="validation_steps=-1"):
        _call(validation_steps=-1)


def test_the_data_stage_refuses_validation_freq_0_when_fit_validates():
    x, y = np.zeros((20, 4), np.float32), np.zeros(20)
    call = _call(validation_freq=0)
    strategy = tf.distribute.get_strategy()
    train, val = stages.fit_data(call, x, y, None, strategy, class_weight=None, validation_split=0.0,
                                 validation_data=None, seed=0)
    assert val is None and train.num_examples == 20  # no validation: freq 0 is never read
    with pytest.raises(ValueError, match="validation_freq=0"):
        stages.fit_data(call, x, y, None, strategy, class_weight=None, validation_split=0.25, validation_data=None,
                        seed=0)


def test_the_model_stage_refuses_an_uncompiled_model_but_predict_takes_it():
    """In Keras's own words first, so that what matches Keras's message matches the trainer's."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError) as keras_error:
        model.fit(np.zeros((4, 4)), np.zeros(4), verbose=0)
    with pytest.raises(ValueError) as ours:
        stages.check_model(model, None)
    assert str(ours.value).startswith(str(keras_error.value))
    assert "Received: an uncompiled Sequential. Call model.compile(optimizer=..., loss=...)" in str(ours.value)
    stages.check_model(model, None, compiled=False)


def test_the_schedule_follows_from_the_global_batch():
    trainer = Trainer(strategy="default", per_replica_batch_size=8, warmup_epochs=1, verbose=0)
    strategy = tf.distribute.get_strategy()
    train, _ = stages.fit_data(_call(), np.zeros((100, 4), np.float32), np.zeros(100), None, strategy,
                               class_weight=None, validation_split=0.0, validation_data=None, seed=0)
    schedule = trainer._batching.schedule(strategy, train, None, None, None)
    assert (schedule.batch.global_batch_size, schedule.source, schedule.user_steps) == (8, "", None)
    assert schedule.steps_per_epoch == 13 and schedule.lr.warmup_steps == 13  # 100 examples: 12 full, 1 of 4
    given = trainer._batching.schedule(strategy, train, 25, None, 2)  # fit's batch_size and steps_per_epoch
    assert (given.batch.global_batch_size, given.user_steps, given.steps_per_epoch) == (25, 2, 2)
    assert given.source == "fit's batch_size=25; Trainer's per_replica_batch_size not used"
    assert given.lr.base_batch_size == 25  # a global batch the user fixed keeps its learning rate


def test_the_plan_is_printed_by_the_chief_when_verbose(capsys):
    plan = Plan(**PLAN)
    stages.announce(plan, verbose=0, is_chief=True)
    stages.announce(plan, verbose=1, is_chief=False)
    assert capsys.readouterr().out == ""
    stages.announce(plan, verbose=1, is_chief=True)
    assert capsys.readouterr().out == plan.describe() + "\n"
