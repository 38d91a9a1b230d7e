"""Standard keras.callbacks run unchanged under Trainer.fit."""

import keras
import numpy as np
import pytest

from conftest import mirrored, tiny_data, tiny_model
from trainer import Trainer, _compat


def _fit(callbacks, epochs=6, lr=0.05, strategy=None, **kwargs):
    x, y, w = tiny_data(256)
    trainer = Trainer(strategy=strategy or mirrored(2), per_replica_batch_size=16, lr_scaling=None, verbose=0)
    return trainer.fit(tiny_model(lr=lr), (x, y), epochs=epochs, validation_data=(x[:64], y[:64]),
                       callbacks=callbacks, **kwargs)


@pytest.mark.slow
def test_history_records_every_epoch_and_points_at_the_model():
    history = _fit([], epochs=3)
    assert history.epoch == [0, 1, 2]
    assert set(history.history) == {"loss", "accuracy", "wce", "val_loss", "val_accuracy", "val_wce"}  # Keras's
    assert all(len(v) == 3 for v in history.history.values())
    assert isinstance(history.model, keras.Model)
    assert history.params["epochs"] == 3 and history.params["steps"] == 8


@pytest.mark.slow
def test_early_stopping_restores_best_weights():
    class Snapshot(keras.callbacks.Callback):
        weights = {}

        def on_epoch_end(self, epoch, logs=None):
            self.weights[epoch] = [w.copy() for w in self.model.get_weights()]

    snapshot = Snapshot()
    # patience 1 with a huge LR: the loss diverges, training stops early, best weights come back.
    stopper = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, restore_best_weights=True)
    history = _fit([snapshot, stopper], epochs=20, lr=3.0)
    losses = history.history["val_loss"]
    assert len(losses) < 20
    best = int(np.argmin(losses))
    for restored, kept in zip(history.model.get_weights(), snapshot.weights[best]):
        np.testing.assert_array_equal(restored, kept)


@pytest.mark.slow
def test_reduce_lr_on_plateau_lowers_the_learning_rate():
    # Epoch 0 sets the best loss; epochs 1 and 2 can't beat it by min_delta, so each halves the LR.
    reducer = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0)
    history = _fit([reducer], epochs=4, lr=0.04)
    np.testing.assert_allclose(history.history["learning_rate"], [0.04, 0.04, 0.02, 0.01], rtol=1e-6)


@pytest.mark.slow
def test_learning_rate_scheduler_sets_each_epoch():
    scheduler = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.1 / (epoch + 1))
    history = _fit([scheduler], epochs=3)
    np.testing.assert_allclose(history.history["learning_rate"], [0.1, 0.05, 0.1 / 3], rtol=1e-6)


def test_terminate_on_nan_stops_training():
    x, y, w = tiny_data(256)
    x[200:] = np.nan  # non-finite inputs make the loss NaN from step 13 on (14 with oneDNN, whose ReLU maps NaN to 0)
    trainer = Trainer(strategy="default", per_replica_batch_size=16, verbose=0, shuffle=False)
    with pytest.warns(UserWarning, match="non-finite"):
        history = trainer.fit(tiny_model(), (x, y), epochs=5, callbacks=[keras.callbacks.TerminateOnNaN()])
    assert len(history.epoch) == 1
    assert np.isnan(history.history["loss"][0])


@pytest.mark.slow
def test_lambda_callback_sees_every_hook_in_order():
    events = []
    hooks = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: events.append("train_begin"),
        on_epoch_begin=lambda epoch, logs: events.append(f"epoch_begin{epoch}"),
        on_train_batch_end=lambda batch, logs: events.append(f"batch{batch}:{logs['loss'] > 0}"),
        on_epoch_end=lambda epoch, logs: events.append(f"epoch_end{epoch}:{sorted(logs)[0]}"),
        on_train_end=lambda logs: events.append("train_end"),
    )
    _fit([hooks], epochs=2)
    batches = [f"batch{i}:True" for i in range(8)]
    assert events == (["train_begin", "epoch_begin0"] + batches + ["epoch_end0:accuracy", "epoch_begin1"]
                      + batches + ["epoch_end1:accuracy", "train_end"])


@pytest.mark.slow
def test_stop_training_is_honoured_mid_epoch():
    class StopAtStep(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if batch == 2:
                self.model.stop_training = True

    stopper = StopAtStep()
    history = _fit([stopper], epochs=4)
    assert stopper.steps == 3 and history.epoch == [0]
    assert len(history.history["loss"]) == 1


def test_fused_steps_call_batch_hooks_once_per_execution():
    class CountBatches(keras.callbacks.Callback):
        handles_fused_steps = True  # opts out of forcing one step per call
        seen = []

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append(batch)

    counter = CountBatches()
    x, y, w = tiny_data(256)
    Trainer(strategy="default", per_replica_batch_size=16, steps_per_execution=3, verbose=0).fit(
        tiny_model(), (x, y), epochs=1, callbacks=[counter])
    # 16 steps: five executions of 3, then 1, which Keras names as an execution of 3 (from Keras 3.11 on, its
    # end_step, begin + 3 - 1: 17; before, the step it began at: 15)
    assert counter.seen == ([2, 5, 8, 11, 14, 17] if _compat.KERAS_VERSION >= (3, 11) else [0, 3, 6, 9, 12, 15])


@pytest.mark.slow
def test_keras_file_callbacks_work_on_one_worker(tmp_path):
    csv_logger = keras.callbacks.CSVLogger(str(tmp_path / "keras.csv"))
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="val_loss", save_best_only=True)
    history = _fit([csv_logger, checkpoint], epochs=2)
    rows = (tmp_path / "keras.csv").read_text().strip().splitlines()
    assert len(rows) == 3 and rows[0].startswith("epoch")
    reloaded = keras.models.load_model(tmp_path / "best.keras")
    assert len(reloaded.get_weights()) == len(history.model.get_weights())


class _Recorder(keras.callbacks.Callback):
    """Every test and predict hook with its batch and logs, as the callback sees them (at the start of a pass,
    the callback's params in place of a batch)."""

    def __init__(self):
        super().__init__()
        self.events = []

    def _record(self, hook, batch=None, logs=None):
        logs = {k: (np.asarray(v) if k == "outputs" else round(float(v), 5)) for k, v in (logs or {}).items()}
        self.events.append((hook, batch, list(logs), logs))

    def on_test_begin(self, logs=None):
        self._record("test_begin", sorted(self.params.items()))

    def on_test_batch_begin(self, batch, logs=None):
        self._record("test_batch_begin", batch)

    def on_test_batch_end(self, batch, logs=None):
        self._record("test_batch_end", batch, logs)

    def on_test_end(self, logs=None):
        self._record("test_end", None, logs)

    def on_predict_begin(self, logs=None):
        self._record("predict_begin", sorted(self.params.items()))

    def on_predict_batch_begin(self, batch, logs=None):
        self._record("predict_batch_begin", batch)

    def on_predict_batch_end(self, batch, logs=None):
        self._record("predict_batch_end", batch, logs)

    def on_predict_end(self, logs=None):
        self._record("predict_end")


def _same_events(ours, theirs):
    assert [e[:3] for e in ours] == [e[:3] for e in theirs]  # hooks, batches (params) and log keys, in order
    for (_, _, keys, mine), (_, _, _, keras_logs) in zip(ours, theirs):
        for key in keys:
            np.testing.assert_allclose(mine[key], keras_logs[key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_evaluate_and_predict_call_the_hooks_model_evaluate_and_predict_call(replicas, steps_per_execution):
    # With compile(steps_per_execution=3), Keras's hooks bracket calls of 3 batches (begin at 0 and 3), a call's
    # outputs joined in on_predict_batch_end's logs.
    x, y, _ = tiny_data(72)  # batches of 16: four whole and one of 8
    trainer = Trainer(strategy=mirrored(replicas) if replicas > 1 else "default", lr_scaling=None, verbose=0)
    model, reference = (tiny_model(steps_per_execution=steps_per_execution) for _ in range(2))
    ours, theirs = _Recorder(), _Recorder()
    result = trainer.evaluate(model, x, y, batch_size=16, callbacks=[ours], return_dict=True, verbose=0)
    expected = reference.evaluate(x, y, batch_size=16, callbacks=[theirs], return_dict=True, verbose=0)
    assert list(result) == list(expected)  # Keras's key order too
    trainer.predict(model, x, batch_size=16, callbacks=[ours], verbose=0)
    reference.predict(x, batch_size=16, callbacks=[theirs], verbose=0)
    ends = [e[1] for e in theirs.events if e[0] == "predict_batch_end"]
    # Keras names a call by its last batch from 3.11 on, by its first before.
    assert ends == ([0, 1, 2, 3, 4] if steps_per_execution == 1 else [2, 5] if _compat.KERAS_VERSION >= (3, 11)
                    else [0, 3])
    _same_events(ours.events, theirs.events)


def test_validation_calls_the_test_batch_hooks_and_stop_evaluating_ends_a_pass():
    x, y, _ = tiny_data(64)

    class StopAfterTwo(_Recorder):
        def on_test_batch_end(self, batch, logs=None):
            super().on_test_batch_end(batch, logs)
            if batch == 1:
                self.model.stop_evaluating = True

    ours, theirs = StopAfterTwo(), StopAfterTwo()
    Trainer(strategy=mirrored(2), lr_scaling=None, shuffle=False, verbose=0).fit(
        tiny_model(), x, y, batch_size=16, epochs=1, validation_data=(x, y), callbacks=[ours])
    tiny_model().fit(x, y, batch_size=16, epochs=1, validation_data=(x, y), callbacks=[theirs], shuffle=False,
                     verbose=0)
    assert [e[1] for e in theirs.events if e[0] == "test_batch_end"] == [0, 1]
    _same_events(ours.events, theirs.events)


def test_stop_predicting_ends_predict_with_the_batches_so_far_as_model_predict():
    x, _, _ = tiny_data(72)

    class StopAfterTwo(_Recorder):
        def on_predict_batch_end(self, batch, logs=None):
            super().on_predict_batch_end(batch, logs)
            if batch == 1:
                self.model.stop_predicting = True

    ours, theirs = StopAfterTwo(), StopAfterTwo()
    model = tiny_model()
    predicted = Trainer(strategy=mirrored(2), verbose=0).predict(model, x, batch_size=16, callbacks=[ours], verbose=0)
    expected = model.predict(x, batch_size=16, callbacks=[theirs], verbose=0)
    assert len(expected) == 32
    np.testing.assert_allclose(predicted, expected, rtol=1e-6)
    _same_events(ours.events, theirs.events)


class CountsItsCalls(keras.Model):
    """Keras's own test model of current state (callback_test.py): its call counts itself in a variable."""

    def __init__(self):
        super().__init__()
        self.head = keras.layers.Dense(3)
        self.calls = self.add_variable(shape=(), initializer="zeros", trainable=False)

    def call(self, x):
        self.calls.assign(self.calls + 1)
        return self.head(x)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_callback_reads_a_variable_with_int_and_float_as_on_one_device(replicas):
    # On replicas the model's variables are MirroredVariables for the call, which have no int() or float() of
    # their own (so Keras's own fit in a MirroredStrategy's scope fails on them).
    x, y, _ = tiny_data(64)

    class Reads(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append((int(self.model.calls), float(self.model.optimizer.learning_rate)))

    runs, conversions = [], (keras.Variable.__int__, keras.Variable.__float__)
    for side in ("keras", "trainer"):
        keras.utils.set_random_seed(0)
        model, reads = CountsItsCalls(), Reads()
        model.compile(keras.optimizers.SGD(0.05), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        if side == "keras":
            model.fit(x, y, batch_size=16, epochs=2, shuffle=False, callbacks=[reads], verbose=0)
        else:
            trainer = Trainer(strategy=mirrored(replicas) if replicas > 1 else "default", lr_scaling=None, verbose=0)
            trainer.fit(model, x, y, batch_size=16, epochs=2, shuffle=False, callbacks=[reads])
        runs.append((reads.seen, int(model.calls)))
    assert runs[1] == runs[0]
    assert runs[0][0][-1][0] == 8  # 4 steps an epoch, one call each
    assert (keras.Variable.__int__, keras.Variable.__float__) == conversions  # put back after the call
