"""BackupAndRestore: a killed or preempted run, re-run, ends with the uninterrupted run's weights."""

import errno
import json
import os
import signal

import keras
import numpy as np
import pytest

from trainer.callbacks import BackupAndRestore
from conftest import run_python, run_script, script_failed, SCRIPTS, tiny_data, tiny_model
from trainer import Trainer

SCRIPT = str(SCRIPTS / "backup_run.py")


def _run(workdir, *extra, form="arrays", env=None):
    """The script's process, to be checked by the caller: some runs are killed on purpose."""
    return run_script(SCRIPT, workdir / "backup", workdir / "out.npz", *extra, env={"FORM": form, **(env or {})},
                      check=False)


def _logged(workdir):
    """The JSONLogger's rows without their timings: epoch, loss, learning rate."""
    with open(workdir / "log.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [{k: v for k, v in row.items() if k not in ("epoch_time", "examples_per_second")} for row in rows]


def _assert_same_log(workdir, reference):
    """The resumed run's log continues without duplicates, and the epoch it resumed mid-way logs the loss over
    all of its steps, as the uninterrupted run does."""
    rows, expected = _logged(workdir), _logged(reference)
    assert [row.keys() for row in rows] == [row.keys() for row in expected]
    for row, want in zip(rows, expected):
        assert row == pytest.approx(want, rel=1e-5), (rows, expected)


def _weights(workdir):
    with np.load(workdir / "out.npz") as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    proc = _run(workdir)
    assert proc.returncode == 0, script_failed(proc)
    np.testing.assert_array_equal(np.load(workdir / "out_counts.npy"), np.full(250, 3.0))  # the counter counts
    return workdir


@pytest.mark.parametrize("how, expected_status, resume_step", [
    ("kill", -signal.SIGKILL, 8),  # killed before the backup due at step 12: resumes from step 8
    # SIGTERM at step 6: saved at the end of that call (step 8). The full tier's (TRAINER_TESTS=full): CI's tier
    # runs a SIGTERM's backup on two workers (test_multiworker.py) and under Slurm (test_slurm.py).
    pytest.param("term", 128 + signal.SIGTERM, 8, marks=pytest.mark.full),
])
@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_weights(tmp_path, uninterrupted, how, expected_status, resume_step):
    step = 10 if how == "kill" else 6
    first = _run(tmp_path, how, "1", str(step))
    assert first.returncode == expected_status, script_failed(first)
    assert (tmp_path / "backup" / "backup.npz").exists()
    assert not (tmp_path / "out.npz").exists()
    if how == "term":
        assert f"SIGTERM received; backup saved at epoch 1, step {resume_step}." in first.stdout
    with np.load(tmp_path / "backup" / "backup.npz") as backup:
        assert json.loads(str(backup["state"]))["step"] == resume_step

    second = _run(tmp_path)
    assert second.returncode == 0, script_failed(second)
    assert f"resuming from epoch 1, step {resume_step}" in second.stdout
    assert "completed [1, 2]" in second.stdout
    # Every example trained on exactly once per epoch across the two runs: none skipped or repeated.
    np.testing.assert_array_equal(np.load(tmp_path / "out_counts.npy"), np.full(250, 3.0))
    for resumed, reference in zip(_weights(tmp_path), _weights(uninterrupted)):
        np.testing.assert_allclose(resumed, reference, rtol=1e-6, atol=1e-6)
    assert not (tmp_path / "backup" / "backup.npz").exists()  # removed once training completed
    _assert_same_log(tmp_path, uninterrupted)


@pytest.mark.parametrize("form", ["arrays", pytest.param("pydataset", marks=pytest.mark.full),
                                  pytest.param("batched", marks=pytest.mark.full)])
@pytest.mark.slow
def test_a_kill_between_the_callbacks_epoch_ends_leaves_no_backup_past_the_logged_epochs(tmp_path, uninterrupted,
                                                                                      form):
    """Killed in on_epoch_end of epoch 1, after BackupAndRestore's hook and before JSONLogger's: the backup
    saves once every callback had the hook, so the last one is from the epoch's last step (16), and the re-run
    trains no step of epoch 1, ends it again, logs its row, and reads epoch 2 whole."""
    reference = uninterrupted
    if form != "arrays":  # the batched forms read in input order: a reference of their own
        reference = tmp_path / "reference"
        reference.mkdir()
        assert _run(reference, form=form).returncode == 0
    first = _run(tmp_path, "kill-at-epoch-end", "1", form=form)
    assert first.returncode == -signal.SIGKILL, script_failed(first)
    with np.load(tmp_path / "backup" / "backup.npz") as backup:
        assert (json.loads(str(backup["state"]))["epoch"], json.loads(str(backup["state"]))["step"]) == (1, 16)
    second = _run(tmp_path, form=form)
    assert second.returncode == 0, script_failed(second)
    assert "resuming from epoch 1, step 16" in second.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "out_counts.npy"), np.full(250, 3.0))  # none read twice
    _assert_same_log(tmp_path, reference)  # epoch 1's row too
    for resumed, expected in zip(_weights(tmp_path), _weights(reference), strict=True):
        np.testing.assert_allclose(resumed, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_a_backup_written_on_two_replicas_resumes_mid_epoch_on_three_to_the_same_weights(tmp_path):
    # A global batch of 16 on both layouts (split 8+8, then 6+5+5), no dropout (each replica draws its own).
    layout_free = {"DROPOUT": "0", "BATCH": "global"}
    reference = tmp_path / "reference"
    reference.mkdir()
    assert _run(reference, env=layout_free).returncode == 0
    first = _run(tmp_path, "kill", "1", "10", env=layout_free)
    assert first.returncode == -signal.SIGKILL, script_failed(first)
    second = _run(tmp_path, env={**layout_free, "REPLICAS": "3"})
    assert second.returncode == 0, script_failed(second)
    assert "resuming from epoch 1, step 8" in second.stdout
    assert "written on 2 replica(s) over 1 worker(s)" in second.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "out_counts.npy"), np.full(250, 3.0))
    for resumed, expected in zip(_weights(tmp_path), _weights(reference), strict=True):
        np.testing.assert_allclose(resumed, expected, rtol=1e-5, atol=1e-6)
    _assert_same_log(tmp_path, reference)  # the metric totals saved on 2 replicas go on on 3


@pytest.mark.slow
def test_a_mid_epoch_backup_is_refused_on_another_global_batch_before_anything_changes(tmp_path):
    first = _run(tmp_path, "kill", "1", "10")  # 8 per replica: global batches of 16 on 2 replicas
    assert first.returncode == -signal.SIGKILL, script_failed(first)
    with np.load(tmp_path / "backup" / "backup.npz") as f:
        before = {key: f[key] for key in f.files}
    second = _run(tmp_path, env={"REPLICAS": "3"})  # 8 per replica on 3: global batches of 24
    assert second.returncode == 1
    assert ("stopped at epoch 1, step 8 in global batches of 16 (2 replica(s) over 1 worker(s)), but this run's "
            "global batch is 24 (3 replica(s))") in second.stderr
    assert "Resume with the same global batch, Trainer(batch_size=16), on any layout" in second.stderr
    with np.load(tmp_path / "backup" / "backup.npz") as f:
        assert all(np.array_equal(f[key], value) for key, value in before.items())


@pytest.mark.slow
@pytest.mark.parametrize("form", ["batched", pytest.param("pydataset", marks=pytest.mark.full)])
def test_batched_forms_resume_mid_epoch_to_the_same_weights(tmp_path, form):
    """A batched dataset and a PyDataset resume at the saved step: the skipped batches are read and dropped."""
    reference = tmp_path / "uninterrupted"
    reference.mkdir()
    assert _run(reference, form=form).returncode == 0
    first = _run(tmp_path, "kill", "1", "10", form=form)
    assert first.returncode == -signal.SIGKILL, script_failed(first)
    second = _run(tmp_path, form=form)
    assert second.returncode == 0, script_failed(second)
    assert "resuming from epoch 1, step 8" in second.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "out_counts.npy"), np.full(250, 3.0))  # none skipped or repeated
    for resumed, expected in zip(_weights(tmp_path), _weights(reference)):
        np.testing.assert_allclose(resumed, expected, rtol=1e-6, atol=1e-6)


def test_backup_needs_trainer_fit(tmp_path):
    x, y, w = tiny_data(64)
    with pytest.raises(ValueError, match=r"resumes through Trainer.fit"):
        tiny_model().fit(x, y, epochs=1, verbose=0, callbacks=[BackupAndRestore(tmp_path)])


def test_backup_for_another_model_is_refused(tmp_path):
    x, y, w = tiny_data(64)
    trainer = Trainer(strategy="default", per_replica_batch_size=16, verbose=0)

    class Crash(BackupAndRestore):
        def on_train_end(self, logs=None):  # keep the backup, as a crash would
            self._restore_handler()

    trainer.fit(tiny_model(), (x, y), epochs=1, callbacks=[Crash(tmp_path)])
    import keras

    other = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    other.compile("sgd", "mse")
    with pytest.raises(ValueError, match=r"holds \d+ model and \d+ optimizer variables.*Delete the backup"):
        trainer.fit(other, (x, np.eye(3)[y]), epochs=2, callbacks=[BackupAndRestore(tmp_path)])


def test_a_fit_that_raises_leaves_the_sigterm_handler_as_it_found_it(tmp_path):
    import keras

    x, y, w = tiny_data(64)
    before = signal.getsignal(signal.SIGTERM)

    class Fails(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            raise RuntimeError("a callback failed")

    backup = BackupAndRestore(tmp_path)
    with pytest.raises(RuntimeError, match="a callback failed"):
        Trainer(strategy="default", per_replica_batch_size=16, verbose=0).fit(
            tiny_model(), (x, y), epochs=1, callbacks=[backup, Fails()])
    assert signal.getsignal(signal.SIGTERM) is before
    assert backup._previous_handler is None


def test_bad_save_freq():
    with pytest.raises(ValueError, match=r"`save_freq`.*save_freq='batch'"):
        BackupAndRestore("x", save_freq="batch")


@pytest.mark.slow
def test_a_backup_whose_metric_totals_do_not_fit_resumes_the_weights_and_says_so(tmp_path):
    x, y, w = tiny_data(64)
    trainer = Trainer(strategy="default", per_replica_batch_size=8, verbose=0)

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                raise RuntimeError("stopped")  # after the backup at step 4

    with pytest.raises(RuntimeError, match="stopped"):
        trainer.fit(tiny_model(), (x, y), epochs=2, callbacks=[BackupAndRestore(tmp_path, save_freq=4), Stop()])
    with np.load(tmp_path / "backup.npz") as backup:
        assert json.loads(str(backup["state"]))["metric_vars"] > 0  # the loss's and the metrics' totals
    other = tiny_model()
    other.compile(other.optimizer, other.loss, metrics=["accuracy"])  # one metric fewer than at the backup
    with pytest.warns(UserWarning, match=r"metric totals do not fit .* epoch 0 cover only the steps from 4 on"):
        history = trainer.fit(other, (x, y), epochs=2, callbacks=[BackupAndRestore(tmp_path, save_freq=4)])
    assert history.epoch == [0, 1] and np.isfinite(history.history["loss"]).all()


@pytest.mark.slow
def test_a_full_disk_mid_backup_keeps_the_previous_backup_and_resumes_from_it(tmp_path, monkeypatch, capsys):
    x, y, w = tiny_data(64)
    trainer = Trainer(strategy="default", per_replica_batch_size=8, steps_per_execution=2, verbose=0)
    reference = trainer.fit(tiny_model(optimizer="adam"), (x, y), epochs=2).model.get_weights()

    real_savez, calls = np.savez, []

    def savez(path, **arrays):
        calls.append(path)
        if len(calls) == 3:  # the backup due at step 6 of epoch 0
            with open(path, "wb") as f:
                f.write(b"half a backup")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_savez(path, **arrays)

    monkeypatch.setattr(np, "savez", savez)
    with pytest.raises(OSError) as caught:
        trainer.fit(tiny_model(optimizer="adam"), (x, y), epochs=2,
                    callbacks=[BackupAndRestore(tmp_path, save_freq=2)])
    path = tmp_path / "backup.npz"
    assert caught.value.errno == errno.ENOSPC
    assert f"BackupAndRestore could not write {path}: No space left on device" in str(caught.value)
    assert f"The previous backup {path} (epoch 0, step 4) is intact" in str(caught.value)
    assert os.listdir(tmp_path) == ["backup.npz"]  # no temp files
    monkeypatch.setattr(np, "savez", real_savez)

    history = trainer.fit(tiny_model(optimizer="adam"), (x, y), epochs=2,
                          callbacks=[BackupAndRestore(tmp_path, save_freq=2)])
    assert f"resuming from epoch 0, step 4 ({path})" in capsys.readouterr().out
    for resumed, expected in zip(history.model.get_weights(), reference):
        np.testing.assert_allclose(resumed, expected, rtol=1e-6, atol=1e-7)


def _py_map(ds):
    import tensorflow as tf

    return ds.map(lambda x, y: (tf.ensure_shape(tf.py_function(lambda v: v, [x], tf.float32), x.shape), y))


@pytest.mark.parametrize("make, exact, why", [
    (lambda ds: ds, True, "state at its pass's start"),
    (lambda ds: ds.shuffle(64, seed=1, reshuffle_each_iteration=False), True, "state at its pass's start"),
    (lambda ds: ds.shuffle(64), True, "a shuffle's seeds, no examples"),
    (lambda ds: _py_map(ds).shuffle(64), False, "reshuffle_each_iteration), and tf.data can't save this "
                                                "pipeline's place"),
    (lambda ds: _py_map(ds), True, "the epoch and step; the resumed run reads the pass again"),
], ids=["plain", "seeded-once", "reshuffled", "py-function-reshuffled", "py-function"])
def test_the_plan_says_whether_a_backup_resumes_exactly(tmp_path, capsys, make, exact, why):
    import tensorflow as tf

    x, y, w = tiny_data(64)
    dataset = make(tf.data.Dataset.from_tensor_slices((x, y)))
    trainer = Trainer(strategy="default", batch_size=16, verbose=1)
    trainer.fit(tiny_model(), dataset, epochs=1, callbacks=[BackupAndRestore(tmp_path)])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("  resume "))
    if exact:
        assert "exact: a backup resumes at its step to the uninterrupted run's numbers" in row
        assert "global batch 16" in row and why in row, row
    else:
        assert row.split("resume", 1)[1].strip().startswith("not exact: ") and why in row, row


def test_the_plan_says_what_a_resumed_stream_holds_and_that_parameter_servers_are_not_exact(tmp_path, capsys):
    import tensorflow as tf

    from trainer.data.input_kind import Resumption
    from trainer.engine.plan import resume_note

    x, y, w = tiny_data(64)
    trainer = Trainer(strategy="default", batch_size=16, verbose=1)
    stream = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    trainer.fit(tiny_model(), stream, epochs=1, steps_per_epoch=2, callbacks=[BackupAndRestore(tmp_path)])
    assert "holds the tf.data pipeline's state at each epoch's start (with its shuffle and prefetch buffers)" in (
        capsys.readouterr().out)
    trainer.fit(tiny_model(), _py_map(stream), epochs=1, steps_per_epoch=2, callbacks=[BackupAndRestore(tmp_path)])
    assert "not exact: steps_per_epoch cuts one stream of the dataset into epochs, and tf.data can't save" in (
        capsys.readouterr().out)
    trainer.fit(tiny_model(), (x, y), epochs=1)  # no resuming callback: no row
    assert "  resume " not in capsys.readouterr().out
    note = resume_note(Resumption(), parameter_server=True, global_batch_size=64)
    assert note.startswith("not exact: under parameter-server training each worker repeats its own shard")


def test_a_shuffle_without_any_seed_is_told_apart(tmp_path):
    """In a fresh process with no global seed (this one has one): the seeds TensorFlow gives the op are 0."""
    script = tmp_path / "shuffles.py"
    script.write_text(
        "import json, tensorflow as tf\n"
        "from trainer import _compat\n"
        "ds = tf.data.Dataset.range(8)\n"
        "cases = [ds.shuffle(8, reshuffle_each_iteration=False),\n"
        "         ds.shuffle(8, seed=3, reshuffle_each_iteration=False)]\n"
        "print(json.dumps([_compat.dataset_shuffles(d) for d in cases]))\n")
    assert run_python(script) == [[[False, False]], [[False, True]]]


def test_the_launchers_backup_folder_gives_each_fit_a_backup_of_its_own(tmp_path, monkeypatch):
    """trainer-launch --max-restarts sets TRAINER_BACKUP_DIR: a fit without a backup of its own backs up in
    fit-1, fit-2, ... (in the order the script runs them), and one with its own keeps only that."""
    import itertools

    import keras

    from trainer.callbacks import backup

    monkeypatch.setenv("TRAINER_BACKUP_DIR", str(tmp_path))
    monkeypatch.setattr(backup, "_launcher_fits", itertools.count(1))
    given = backup.launcher_backup([]) + backup.launcher_backup([])
    assert [type(c) for c in given] == [BackupAndRestore, BackupAndRestore]
    assert [c.backup_dir for c in given] == [str(tmp_path / "fit-1"), str(tmp_path / "fit-2")]
    for own in (BackupAndRestore(str(tmp_path / "own")), keras.callbacks.BackupAndRestore(str(tmp_path / "k"))):
        assert backup.launcher_backup([own]) == [own]
    monkeypatch.delenv("TRAINER_BACKUP_DIR")
    assert backup.launcher_backup([]) == []
