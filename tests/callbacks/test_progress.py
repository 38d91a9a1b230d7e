"""ProgressBar: bounded plain output without a terminal, a tqdm bar with one, chief only."""

import io

import pytest

from trainer.callbacks import ProgressBar
from conftest import as_worker, mirrored, tiny_data, tiny_model
from trainer import Trainer


def _fit(callbacks, epochs=2, n=800, verbose=0, **kwargs):
    x, y, w = tiny_data(n)
    trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=4, verbose=verbose, **kwargs)
    return trainer.fit(tiny_model(), (x, y), epochs=epochs, validation_data=(x[:50], y[:50]), callbacks=callbacks)


@pytest.mark.slow
def test_plain_output_is_a_few_lines_per_epoch():
    out = io.StringIO()  # not a TTY
    _fit([ProgressBar(file=out)], epochs=3, steps_per_execution=1)  # 100 steps per epoch
    lines = out.getvalue().splitlines()
    assert 3 <= len(lines) <= 3 * 5
    summaries = [line for line in lines if "done in" in line]
    assert len(summaries) == 3
    assert all("val_loss" in summary and "ex/s" in summary for summary in summaries)
    assert "Epoch 1/3  25/100" in lines[0]


@pytest.mark.slow
def test_bar_mode_draws_tqdm_with_metrics():
    out = io.StringIO()
    _fit([ProgressBar(mode="bar", file=out)], epochs=1)
    text = out.getvalue()
    assert "Epoch 1/1" in text and "100/100" in text and "val_accuracy" in text and "step" in text


@pytest.mark.slow
def test_epoch_mode_is_one_line_per_epoch():
    out = io.StringIO()
    _fit([ProgressBar(mode="epoch", file=out)], epochs=2)
    assert len(out.getvalue().splitlines()) == 2


@pytest.mark.slow
def test_non_chief_draws_nothing():
    out = io.StringIO()
    _fit([as_worker(ProgressBar(file=out))], epochs=1)
    assert out.getvalue() == ""


@pytest.mark.slow
def test_verbose_fit_prints_plan_and_one_progress_display(capsys):
    _fit([], epochs=2, verbose=1)
    out = capsys.readouterr().out
    assert out.count("Training plan") == 1
    assert out.count("done in") == 2  # our bar only; Keras's Progbar would print "step -" lines
    assert "━" not in out and "step - " not in out
    assert len(out.splitlines()) < 30


def test_bad_mode():
    with pytest.raises(ValueError, match=r"`mode` must be .*mode='fancy'"):
        ProgressBar(mode="fancy")
