"""CSVLogger, JSONLogger and TensorBoard: the files they write, re-read from disk."""

import csv
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from trainer.callbacks import CSVLogger, JSONLogger, TensorBoard
from conftest import as_worker, mirrored, tiny_data, tiny_model
from trainer import Trainer


def _fit(callbacks, epochs=3, initial_epoch=0, model=None):
    x, y, w = tiny_data(256)
    trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0)
    return trainer.fit(model or tiny_model(), (x, y), epochs=epochs, initial_epoch=initial_epoch,
                       validation_data=(x[:64], y[:64]), callbacks=callbacks)


def _read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_rows_equal_the_history(tmp_path):
    history = _fit([CSVLogger(tmp_path / "log.csv"), JSONLogger(tmp_path / "log.jsonl")])
    json_rows, csv_rows = _read_jsonl(tmp_path / "log.jsonl"), _read_csv(tmp_path / "log.csv")
    assert [r["epoch"] for r in json_rows] == [0, 1, 2]
    assert [int(r["epoch"]) for r in csv_rows] == [0, 1, 2]
    for key, values in history.history.items():
        np.testing.assert_allclose([r[key] for r in json_rows], values, rtol=1e-12, err_msg=key)
        np.testing.assert_allclose([float(r[key]) for r in csv_rows], values, rtol=1e-12, err_msg=key)
    for row in json_rows:
        assert row["epoch_time"] > 0 and row["examples_per_second"] > 0
        assert row["learning_rate"] == pytest.approx(0.05 * 2)  # SGD: linear rule, 2 replicas


@pytest.mark.slow
def test_resumed_run_continues_without_duplicating_epochs(tmp_path):
    model = tiny_model()
    paths = tmp_path / "log.jsonl", tmp_path / "log.csv"
    _fit([JSONLogger(paths[0]), CSVLogger(paths[1])], epochs=3, model=model)
    # A run that resumes at epoch 1 (as after a crash) rewrites epochs 1 and 2.
    history = _fit([JSONLogger(paths[0]), CSVLogger(paths[1])], epochs=4, initial_epoch=1, model=model)
    json_rows, csv_rows = _read_jsonl(paths[0]), _read_csv(paths[1])
    assert [r["epoch"] for r in json_rows] == [0, 1, 2, 3]
    assert [int(r["epoch"]) for r in csv_rows] == [0, 1, 2, 3]
    np.testing.assert_allclose([r["loss"] for r in json_rows[1:]], history.history["loss"], rtol=1e-12)


@pytest.mark.slow
def test_a_line_torn_by_a_crash_is_dropped_on_resume(tmp_path):
    model, path = tiny_model(), tmp_path / "log.jsonl"
    _fit([JSONLogger(path)], epochs=2, model=model)
    with open(path, "a") as f:
        f.write('{"epoch": 2, "loss": 0.')  # the append a crash cut short
    history = _fit([JSONLogger(path)], epochs=3, initial_epoch=2, model=model)
    rows = _read_jsonl(path)
    assert [r["epoch"] for r in rows] == [0, 1, 2]
    assert rows[2]["loss"] == pytest.approx(history.history["loss"][0], rel=1e-12)


def test_a_bad_line_that_is_not_the_last_is_refused_with_its_number(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"epoch": 0, "loss": 1.0}\nnot json\n{"epoch": 1, "loss": 0.5}\n')
    with pytest.raises(ValueError, match=r"line 2 is not JSON.*'not json\\n'.*Fix or remove that line"):
        JSONLogger(path).keep_rows_before(1)
    assert path.read_text().startswith('{"epoch": 0')  # left as it was


@pytest.mark.slow
def test_only_the_chief_writes(tmp_path):
    _fit([as_worker(CSVLogger(tmp_path / "log.csv")), as_worker(JSONLogger(tmp_path / "log.jsonl")),
          as_worker(TensorBoard(tmp_path / "tb"))], epochs=1)
    assert os.listdir(tmp_path) == []


def _scalars(directory):
    values = {}
    for path in tf.io.gfile.glob(os.path.join(directory, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                values.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return values


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_history(tmp_path):
    history = _fit([TensorBoard(tmp_path / "tb", update_freq=3)], epochs=2)
    train, val = _scalars(tmp_path / "tb" / "train"), _scalars(tmp_path / "tb" / "validation")
    np.testing.assert_allclose([train["epoch_loss"][e] for e in (0, 1)], history.history["loss"], rtol=1e-6)
    np.testing.assert_allclose([val["epoch_accuracy"][e] for e in (0, 1)], history.history["val_accuracy"], rtol=1e-6)
    steps = sorted(train["batch_loss"])
    assert len(steps) >= 2 and all(b - a >= 3 for a, b in zip(steps, steps[1:]))


def test_tensorboard_bad_update_freq():
    with pytest.raises(ValueError, match=r"`update_freq`.*update_freq=0"):
        TensorBoard("x", update_freq=0)
