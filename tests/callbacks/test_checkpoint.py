"""ModelCheckpoint: best k and last, atomic writes, loads without a strategy."""

import errno
import os
from pathlib import Path

import keras
import numpy as np
import pytest

from trainer.callbacks import ModelCheckpoint
from trainer.callbacks.checkpoint import INDEX
from conftest import as_worker, LearningRateSeen, mirrored, run_code, script_failed, tiny_data, tiny_model
from trainer import Trainer


def _fit(callbacks, epochs=4, lr=0.05, model=None):
    x, y, w = tiny_data(256)
    trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0)
    history = trainer.fit(model or tiny_model(lr=lr), (x, y), epochs=epochs, validation_data=(x[:64], y[:64]),
                          callbacks=callbacks)
    return trainer, history


@pytest.mark.slow
def test_keeps_the_best_k_and_the_last(tmp_path):
    checkpoint = ModelCheckpoint(tmp_path, monitor="val_loss", save_best_only=True, keep=2)
    _, history = _fit([checkpoint], epochs=5)
    losses = history.history["val_loss"]
    best_two = sorted(range(5), key=lambda e: losses[e])[:2]
    expected = {f"epoch{e + 1:03d}.keras" for e in best_two} | {"last.keras", INDEX}
    assert set(os.listdir(tmp_path)) == expected
    index = ModelCheckpoint.read_index(tmp_path)
    assert index["best"] == f"epoch{int(np.argmin(losses)) + 1:03d}.keras"
    assert {k["epoch"]: k["value"] for k in index["kept"]} == pytest.approx({e: losses[e] for e in best_two})
    assert index["last"]["epoch"] == 4


@pytest.mark.slow
def test_checkpoint_from_a_strategy_loads_without_one_and_evaluates_the_same(tmp_path):
    x, y, w = tiny_data(256)
    trainer, history = _fit([ModelCheckpoint(tmp_path), ModelCheckpoint(tmp_path / "w", save_weights_only=True)],
                            epochs=2)
    expected = trainer.evaluate(history.model, (x, y, w), return_dict=True)
    plain = Trainer(strategy="default", batch_size=32, verbose=0)

    loaded = keras.models.load_model(ModelCheckpoint.last_path(tmp_path))
    for key, value in plain.evaluate(loaded, (x, y, w), return_dict=True).items():
        assert value == pytest.approx(expected[key], rel=1e-6), key

    fresh = tiny_model()
    fresh.load_weights(ModelCheckpoint.last_path(tmp_path / "w"))
    for key, value in plain.evaluate(fresh, (x, y, w), return_dict=True).items():
        assert value == pytest.approx(expected[key], rel=1e-6), key
    assert int(loaded.optimizer.iterations.numpy()) == 2 * 8  # optimizer state came along


@pytest.mark.slow
def test_recent_k_when_not_ranking(tmp_path):
    _fit([ModelCheckpoint(tmp_path, keep=2, save_last=False)], epochs=4)
    assert set(os.listdir(tmp_path)) == {"epoch003.keras", "epoch004.keras", INDEX}


@pytest.mark.slow
def test_a_full_disk_mid_write_keeps_the_last_checkpoint_and_says_so(tmp_path):
    first_epoch = []

    class FullDiskInSecondEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                first_epoch.extend(self.model.get_weights())

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                def full_disk(path, *args, **kwargs):
                    with open(path, "wb") as f:
                        f.write(b"half a checkpoint")
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

                self.model.save = full_disk

    with pytest.raises(OSError) as caught:
        _fit([FullDiskInSecondEpoch(), ModelCheckpoint(tmp_path)], epochs=3)
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC
    assert (f"ModelCheckpoint could not write {tmp_path / 'epoch002.keras'}: "
            "No space left on device (OSError:") in message
    assert f"The previous checkpoint {tmp_path / 'last.keras'} is intact" in message
    assert sorted(os.listdir(tmp_path)) == ["checkpoints.json", "epoch001.keras", "last.keras"]  # no temp files
    assert ModelCheckpoint.read_index(tmp_path)["last"]["epoch"] == 0
    for saved, expected in zip(keras.models.load_model(tmp_path / "last.keras").get_weights(), first_epoch):
        np.testing.assert_array_equal(saved, expected)


@pytest.mark.slow
def test_the_next_write_removes_what_a_writer_killed_mid_write_left(tmp_path):
    from trainer.callbacks._cluster import replace_atomically

    torn = tmp_path / ".backup.npz.tmp-k1lled.npz"  # a writer SIGKILLed mid-write leaves its temporary file
    torn.write_bytes(b"half a backup")
    other = tmp_path / ".last.keras.tmp-k1lled.keras"  # another file's: its own next write removes it
    other.write_bytes(b"half a checkpoint")
    replace_atomically(lambda path: Path(path).write_bytes(b"whole"), str(tmp_path / "backup.npz"), suffix=".npz")
    assert sorted(os.listdir(tmp_path)) == [other.name, "backup.npz"]
    assert (tmp_path / "backup.npz").read_bytes() == b"whole"


def test_a_crash_after_an_eviction_leaves_no_index_entry_without_its_file(tmp_path):
    class FailOnSecondSaveOfEpochTwo(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:  # epoch002.keras is saved (evicting epoch001.keras), then saving last.keras fails
                save, calls = self.model.save, []

                def failing(path, *args, **kwargs):
                    calls.append(path)
                    if len(calls) == 2:
                        raise OSError(errno.EIO, os.strerror(errno.EIO))
                    return save(path, *args, **kwargs)

                self.model.save = failing

    with pytest.raises(OSError):
        _fit([FailOnSecondSaveOfEpochTwo(), ModelCheckpoint(tmp_path, keep=1)], epochs=2)
    index = ModelCheckpoint.read_index(tmp_path)
    assert [k["file"] for k in index["kept"]] == ["epoch001.keras"]  # the index of epoch 1, still in force
    for named in (ModelCheckpoint.best_path(tmp_path), ModelCheckpoint.last_path(tmp_path)):
        assert os.path.exists(named), named
        keras.models.load_model(named)


@pytest.mark.slow
def test_a_loaded_checkpoint_is_scaled_once_by_the_next_fit(tmp_path):
    x, y, w = tiny_data(256)
    trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, lr_scaling="linear", verbose=0)
    during, after_save = LearningRateSeen(), LearningRateSeen()
    history = trainer.fit(tiny_model(lr=0.05), (x, y), epochs=1, callbacks=[during, ModelCheckpoint(tmp_path),
                                                                             after_save])
    assert during.seen == after_save.seen == [pytest.approx(0.1)]  # scaled during the fit, put back after saving
    assert float(history.model.optimizer.learning_rate.numpy()) == pytest.approx(0.05)  # as tuned, after the fit
    loaded = keras.models.load_model(ModelCheckpoint.last_path(tmp_path))
    assert float(loaded.optimizer.learning_rate.numpy()) == pytest.approx(0.05)  # as compiled
    assert int(loaded.optimizer.iterations.numpy()) == 8
    resumed = LearningRateSeen()
    trainer.fit(loaded, (x, y), epochs=2, initial_epoch=1, callbacks=[resumed])
    assert resumed.seen == [pytest.approx(0.1)]  # not 0.2


@pytest.mark.slow
def test_non_finite_weights_are_never_saved(tmp_path):
    checkpoint = ModelCheckpoint(tmp_path)
    _fit([checkpoint], epochs=1)
    good = keras.models.load_model(tmp_path / "last.keras").get_weights()
    model = keras.models.load_model(tmp_path / "last.keras")
    model.set_weights([np.full_like(w, np.nan) for w in model.get_weights()])
    checkpoint.set_model(model)
    with pytest.warns(UserWarning, match="not finite"):
        checkpoint.on_epoch_end(1, {"val_loss": float("nan")})
    for before, after in zip(good, keras.models.load_model(tmp_path / "last.keras").get_weights()):
        np.testing.assert_array_equal(before, after)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"`mode`.*'best'"):
        ModelCheckpoint("x", mode="best")
    with pytest.raises(ValueError, match=r"`keep`.*keep=0"):
        ModelCheckpoint("x", keep=0)


@pytest.mark.slow
def test_non_chief_saves_into_a_temporary_directory_that_is_removed(tmp_path, monkeypatch):
    import tempfile

    scratch = []
    real_mkdtemp = tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: scratch.append(real_mkdtemp(**kw)) or scratch[-1])
    _fit([as_worker(ModelCheckpoint(tmp_path / "ckpt"))], epochs=2)
    assert not (tmp_path / "ckpt").exists()
    ours = [d for d in scratch if os.path.basename(d).startswith("trainer-worker-")]
    assert len(ours) == 2 and not any(os.path.exists(d) for d in ours)  # saved each epoch, then deleted


@pytest.mark.slow
def test_callbacks_also_work_with_plain_model_fit(tmp_path):
    from trainer.callbacks import CSVLogger, JSONLogger, ProgressBar
    import io

    x, y, w = tiny_data(128)
    out = io.StringIO()
    model = tiny_model()
    history = model.fit(x, y, epochs=2, verbose=0, validation_data=(x, y), callbacks=[
        ModelCheckpoint(tmp_path / "ckpt"), CSVLogger(tmp_path / "log.csv"), JSONLogger(tmp_path / "log.jsonl"),
        ProgressBar(mode="epoch", file=out)])
    assert ModelCheckpoint.read_index(tmp_path / "ckpt")["last"]["epoch"] == 1
    assert (tmp_path / "log.csv").read_text().count("\n") == 3
    assert out.getvalue().count("done in") == 2
    loaded = keras.models.load_model(tmp_path / "ckpt" / "last.keras")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6)
    assert history.history["loss"]


@pytest.mark.slow
def test_a_new_run_in_the_same_directory_keeps_its_own_checkpoints(tmp_path):
    _fit([ModelCheckpoint(tmp_path, keep=3)], epochs=3)
    _fit([ModelCheckpoint(tmp_path, keep=3)], epochs=1)  # a fresh run, same folder
    index = ModelCheckpoint.read_index(tmp_path)
    assert [k["file"] for k in index["kept"]] == ["epoch001.keras"]
    assert (tmp_path / "epoch001.keras").exists() and index["best"] == "epoch001.keras"


@pytest.mark.slow
def test_checkpoint_with_a_scaled_schedule_loads_in_a_fresh_process(tmp_path):

    model = tiny_model()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=10, decay_rate=0.9)
    model.compile(keras.optimizers.SGD(schedule), model.loss)
    _fit([ModelCheckpoint(tmp_path)], epochs=1, model=model)
    code = ("import keras, trainer.callbacks as cb; m = keras.models.load_model(cb.ModelCheckpoint.last_path("
            f"{str(tmp_path)!r})); print(type(m.optimizer.get_config()['learning_rate']))")
    proc = run_code(code, timeout=120, check=False)
    assert proc.returncode == 0, script_failed(proc)
    assert "dict" in proc.stdout  # the schedule, serialized as Keras serializes one, not a float
