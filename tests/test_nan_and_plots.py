"""NanGuard stops at the first non-finite loss; curves are drawn to PNG files."""

import keras
import matplotlib.image
import numpy as np
import pytest

from callbacks import ModelCheckpoint, PlotHistory, plot_history
from conftest import tiny_data, tiny_model
from trainer import Trainer


def test_nan_guard_is_on_by_default_and_names_epoch_and_step(tmp_path, capfd):
    x, y, w = tiny_data(256)
    # NaN inputs in step 13 (rows 192-207): ReLU maps NaN to 0, so that step's loss stays finite,
    # but its gradient is NaN and the loss of step 14 is not.
    x[200:] = np.nan
    trainer = Trainer(strategy="default", per_replica_batch_size=16, steps_per_execution=1, shuffle=False, verbose=0)
    clean = trainer.fit(tiny_model(), (x[:192], y[:192]), epochs=1, callbacks=[ModelCheckpoint(tmp_path)])
    good = clean.model.get_weights()
    history = trainer.fit(clean.model, (x, y), epochs=5, callbacks=[ModelCheckpoint(tmp_path)])
    assert history.epoch == [0]
    assert "NanGuard: the loss became nan by epoch 0, step 14; training stopped" in capfd.readouterr().err
    # The last checkpoint still holds the clean fit's weights: the NaN weights were not written.
    for saved, expected in zip(keras.models.load_model(tmp_path / "last.keras").get_weights(), good):
        np.testing.assert_array_equal(saved, expected)


def test_nan_guard_can_be_turned_off():
    x, y, w = tiny_data(64)
    x[:] = np.inf
    history = Trainer(strategy="default", per_replica_batch_size=16, nan_guard=False, verbose=0).fit(
        tiny_model(), (x, y), epochs=2)
    assert history.epoch == [0, 1] and np.isnan(history.history["loss"]).all()


def test_history_plot_writes_a_png(tmp_path):
    x, y, w = tiny_data(128)
    history = Trainer(strategy="default", verbose=0).fit(tiny_model(), (x, y), epochs=3, validation_data=(x, y))
    figure = history.plot(tmp_path / "curves.png")
    image = matplotlib.image.imread(tmp_path / "curves.png")
    assert image.ndim == 3 and image.shape[0] > 100
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert titles == ["loss", "accuracy", "wce"]
    lines = figure.axes[0].get_lines()
    assert [l.get_label() for l in lines] == ["train", "validation"]
    np.testing.assert_allclose(lines[0].get_ydata(), history.history["loss"])


def test_plot_history_callback_redraws_each_epoch(tmp_path):
    x, y, w = tiny_data(128)
    seen = []
    record = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, logs: seen.append((tmp_path / "c.png").stat().st_mtime_ns))
    Trainer(strategy="default", verbose=0).fit(tiny_model(), (x, y), epochs=2, callbacks=[PlotHistory(tmp_path / "c.png"), record])
    assert len(seen) == 2 and matplotlib.image.imread(tmp_path / "c.png").ndim == 3


def test_plot_needs_metrics():
    with pytest.raises(ValueError, match="no metrics to plot"):
        plot_history({"learning_rate": [0.1]})
