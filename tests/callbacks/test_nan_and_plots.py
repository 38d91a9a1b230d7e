"""NanGuard stops at the first non-finite loss; curves are drawn to PNG files."""

import json

import keras
import matplotlib.image
import numpy as np
import pytest

from trainer.callbacks import BackupAndRestore, ModelCheckpoint, NanGuard, PlotHistory, plot_history
from conftest import tiny_data, tiny_model
from trainer import Trainer


@pytest.mark.slow
def test_nan_guard_stops_names_the_step_and_keeps_the_last_finite_weights(tmp_path, capfd):
    x, y, w = tiny_data(256)
    # NaN sample weights from step 13 on (rows 192-207): that step's loss, sum(w * l) / sum(w), is NaN
    # whatever the kernels do with NaN (oneDNN's fused MatMul+ReLU turns NaN inputs into 0, so NaN
    # inputs would leave that loss finite), and the weights after step 12 are the last finite ones.
    w[200:] = np.nan
    trainer = Trainer(strategy="default", per_replica_batch_size=16, steps_per_execution=1, shuffle=False, verbose=0)
    clean = trainer.fit(tiny_model(), (x[:192], y[:192], w[:192]), epochs=1)
    backup = BackupAndRestore(tmp_path / "backup", save_freq=4)
    callbacks = [NanGuard(keep_every=1), ModelCheckpoint(tmp_path / "ckpt"), backup]
    with pytest.warns(UserWarning, match=r"`data` sample_weight holds 56 non-finite values"):
        history = trainer.fit(clean.model, (x, y, w), epochs=5, callbacks=callbacks)
    assert history.epoch == [0]
    err = capfd.readouterr().err
    assert "NanGuard: the loss became nan by epoch 0, step 13; training stopped. The model and optimizer hold " \
           "the last finite weights again (after epoch 0, step 12)." in err

    # Independently: the same two fits on the clean rows only; 12 steps of the second are the last finite ones.
    reference = trainer.fit(trainer.fit(tiny_model(), (x[:192], y[:192], w[:192]), epochs=1).model,
                            (x[:192], y[:192], w[:192]), epochs=1).model
    expected = reference.get_weights()
    model = history.model
    assert int(model.optimizer.iterations.numpy()) == 24
    for got, want in zip(model.get_weights(), expected):
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # On disk: the checkpoint saved after the stop holds them, and the backup (step 12) is kept.
    for saved, want in zip(keras.models.load_model(tmp_path / "ckpt" / "last.keras").get_weights(), expected):
        np.testing.assert_allclose(saved, want, rtol=1e-6, atol=1e-7)
    with np.load(tmp_path / "backup" / "backup.npz") as saved:
        state = json.loads(str(saved["state"]))
        assert (state["epoch"], state["step"]) == (0, 12)
        for i, want in enumerate(expected):
            np.testing.assert_allclose(saved[f"model_{i}"], want, rtol=1e-6, atol=1e-7)


def _train_rows(trainer, rows_per_fit, x, y, w):
    model = tiny_model()
    for rows in rows_per_fit:
        if rows:
            model = trainer.fit(model, (x[:rows], y[:rows], w[:rows]), epochs=1).model
    return model


def test_default_nan_guard_restores_finite_weights_from_the_step_it_names(capfd):
    x, y, w = tiny_data(256)
    w[200:] = np.nan  # the loss is NaN from step 13 on, on any kernels (see the test above)
    trainer = Trainer(strategy="default", per_replica_batch_size=16, steps_per_execution=1, shuffle=False, verbose=0)
    guard = NanGuard()  # keep_every="auto": copies within a 2% time budget, so possibly a few steps old
    with pytest.warns(UserWarning, match="non-finite"):
        history = trainer.fit(tiny_model(), (x, y, w), epochs=2, callbacks=[guard])
    assert guard.stopped_at == (0, 13)  # the first step with NaN sample weights
    epoch, step = guard.restored_from
    assert epoch == 0 and 0 <= step <= 12
    assert f"hold the last finite weights again (after epoch 0, step {step})" in capfd.readouterr().err
    expected = _train_rows(trainer, [16 * step], x, y, w).get_weights()  # `step` clean steps, independently
    for got, want in zip(history.model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_nan_guard_can_be_turned_off():
    x, y, w = tiny_data(64)
    x[:] = np.inf
    with pytest.warns(UserWarning, match=r"`data` x holds 512 non-finite values"):
        history = Trainer(strategy="default", per_replica_batch_size=16, nan_guard=False, verbose=0).fit(
            tiny_model(), (x, y), epochs=2)
    assert history.epoch == [0, 1] and np.isnan(history.history["loss"]).all()


@pytest.mark.slow
def test_history_plot_writes_a_png(tmp_path):
    x, y, w = tiny_data(128)
    history = Trainer(strategy="default", verbose=0).fit(tiny_model(), (x, y), epochs=3, validation_data=(x, y))
    figure = history.plot(tmp_path / "curves.png")
    image = matplotlib.image.imread(tmp_path / "curves.png")
    assert image.ndim == 3 and image.shape[0] > 100
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert titles == ["loss", "accuracy", "wce"]
    lines = figure.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["train", "validation"]
    np.testing.assert_allclose(lines[0].get_ydata(), history.history["loss"])


@pytest.mark.slow
def test_plot_history_callback_redraws_each_epoch(tmp_path):
    x, y, w = tiny_data(128)
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda e, logs: seen.append((tmp_path / "c.png").stat().st_mtime_ns))
    Trainer(strategy="default", verbose=0).fit(tiny_model(), (x, y), epochs=2,
                                               callbacks=[PlotHistory(tmp_path / "c.png"), record])
    assert len(seen) == 2 and matplotlib.image.imread(tmp_path / "c.png").ndim == 3


def test_plot_needs_metrics():
    with pytest.raises(ValueError, match="no metrics to plot"):
        plot_history({"learning_rate": [0.1]})
