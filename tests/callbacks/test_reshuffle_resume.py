"""A run SIGKILLed mid-epoch and resumed reads the rest of the cut epoch exactly, for tf.data pipelines that
reshuffle each pass (issue 74's table): every epoch reads each example once, and a seeded pipeline ends on
the uninterrupted run's weights and history, on another layout and through either reader too.

Each case kills tests/scripts/reshuffle_run.py at epoch 1, step 5 (the backup of step 3 survives), runs it
again, and compares with an uninterrupted run of the same pipeline (2 CPU replicas, the in-step reader).
"""

import ast
import signal

import numpy as np
import pytest

from conftest import SCRIPTS, run_script, script_failed

SCRIPT = str(SCRIPTS / "reshuffle_run.py")
EPOCHS = 3
ACCELERATOR = {"TRAINER_ACCELERATOR_READER": "1"}  # the distributed iterator's reader, as on GPUs


def _run(workdir, pipe, *kill, env=None, workers=0):
    launch = ("--workers", workers) if workers else ()
    layout = {"REPLICAS": "1"} if workers else {}
    return run_script(SCRIPT, workdir / "backup", workdir / "out.npz", *map(str, kill), launch=launch,
                      env={"PIPE": pipe, **layout, **(env or {})}, check=False, timeout=400)


def _history(proc) -> dict:
    line = next(line for line in proc.stdout.splitlines() if "history {" in line)
    return ast.literal_eval(line.split("history ", 1)[1])


def _counts(workdir) -> list[np.ndarray]:
    """How often training had read each example by each epoch's end."""
    return [np.load(workdir / f"out_counts{epoch}.npy") for epoch in range(EPOCHS)]


def _weights(workdir) -> list[np.ndarray]:
    with np.load(workdir / "out.npz") as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """The uninterrupted run of each pipeline, made when a test first asks for it."""
    made = {}

    def reference(pipe):
        if pipe not in made:
            workdir = tmp_path_factory.mktemp(f"uninterrupted-{pipe}")
            proc = _run(workdir, pipe)
            assert proc.returncode == 0, script_failed(proc)
            made[pipe] = workdir, _history(proc)
        return made[pipe]

    return reference


def _killed_and_resumed(workdir, pipe, *, env=None, resume_env=None, workers=0, kill=(1, 5), resumes_at=(1, 3)):
    first = _run(workdir, pipe, *kill, env=env, workers=workers)
    if workers:
        assert first.returncode != 0 and "resuming" not in first.stdout, script_failed(first)
    else:
        assert first.returncode == -signal.SIGKILL, script_failed(first)
    second = _run(workdir, pipe, env={**(env or {}), **(resume_env or {})}, workers=workers)
    assert second.returncode == 0, script_failed(second)
    assert "BackupAndRestore: resuming from epoch {}, step {}".format(*resumes_at) in second.stdout, (
        script_failed(second))
    row = next(line for line in second.stdout.splitlines() if "  resume " in line)
    assert "resume         exact: a backup resumes at its step" in row, row
    return second


def _assert_each_example_once_an_epoch(workdir):
    for epoch, counts in enumerate(_counts(workdir)):
        np.testing.assert_array_equal(counts, np.full(700, epoch + 1.0), err_msg=f"epoch {epoch}")


def _assert_uninterrupted(workdir, second, reference):
    """The resumed run's counts after every epoch, its history from the resumed epoch on and its final weights
    are the uninterrupted run's."""
    ref_dir, ref_history = reference
    for epoch, (counts, expected) in enumerate(zip(_counts(workdir), _counts(ref_dir))):
        np.testing.assert_array_equal(counts, expected, err_msg=f"epoch {epoch}")
    history = _history(second)
    assert history.keys() == ref_history.keys()
    for key, values in history.items():
        assert values == pytest.approx(ref_history[key][1:], rel=1e-6, abs=1e-6), key
    for resumed, expected in zip(_weights(workdir), _weights(ref_dir)):
        np.testing.assert_allclose(resumed, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("pipe, env, resume_env", [
    ("seeded", None, None),
    # written by the distributed iterator's reader on 2 replicas, resumed in the step on 1
    ("seeded", ACCELERATOR, {"REPLICAS": "1", "TRAINER_ACCELERATOR_READER": "0"}),
    pytest.param("batched", None, None, marks=pytest.mark.full),
    ("ops", None, None),
    ("function", ACCELERATOR, None),
    ("stream", None, None),
    pytest.param("stream", ACCELERATOR, None, marks=pytest.mark.full),
    pytest.param("ops", ACCELERATOR, None, marks=pytest.mark.full),
], ids=["seeded", "seeded-on-1-replica", "batched", "ops", "function", "stream", "stream-distributed",
        "ops-distributed"])
def test_a_seeded_pipeline_resumes_to_the_uninterrupted_run(tmp_path, references, pipe, env, resume_env):
    second = _killed_and_resumed(tmp_path, pipe, env=env, resume_env=resume_env)
    _assert_uninterrupted(tmp_path, second, references(pipe))
    if pipe != "stream":  # a stream's epochs are not passes: the uninterrupted run's counts are the check
        _assert_each_example_once_an_epoch(tmp_path)


@pytest.mark.slow
def test_a_backup_at_an_epoch_end_resumes_the_next_pass_in_the_uninterrupted_order(tmp_path, references):
    """Killed in epoch 1 before its first backup: the resumed run starts a new pass, whose reshuffled order
    depends on the iterators started before it; Keras's spare iterator at each epoch's end among them."""
    second = _killed_and_resumed(tmp_path, "batched", kill=(1, 0), resumes_at=(1, 0))
    _assert_uninterrupted(tmp_path, second, references("batched"))


@pytest.mark.slow
def test_marking_a_pipeline_leaves_its_numbers_as_without_a_backup(tmp_path, references):
    """The marks read nothing and start no iterator of their own in an uninterrupted run: its weights and
    history are those of the same run without BackupAndRestore (model.fit's orders, reshuffles included)."""
    proc = _run(tmp_path, "seeded", env={"BACKUP": "0"})
    assert proc.returncode == 0, script_failed(proc)
    ref_dir, ref_history = references("seeded")
    assert _history(proc) == ref_history
    for weight, expected in zip(_weights(tmp_path), _weights(ref_dir)):
        np.testing.assert_array_equal(weight, expected)


@pytest.mark.slow
@pytest.mark.parametrize("env", [None, pytest.param(ACCELERATOR, marks=pytest.mark.full)],
                         ids=["in-step", "distributed"])
def test_an_unseeded_shuffle_resumed_reads_each_example_once_an_epoch(tmp_path, env):
    """Without a seed the orders are the process's own, so only the examples read can be compared: the backup
    holds the cut pass's seeds, and the resumed epoch reads the rest of it."""
    _killed_and_resumed(tmp_path, "unseeded", env=env)
    _assert_each_example_once_an_epoch(tmp_path)


@pytest.mark.slow
def test_a_seeded_shuffle_resumes_on_two_workers_to_one_process_numbers(tmp_path, references):
    """trainer-launch --workers 2, one replica each, both killed at epoch 1, step 5: the relaunched job ends on
    the uninterrupted single-process run's weights."""
    second = _killed_and_resumed(tmp_path, "seeded", workers=2)
    _assert_uninterrupted(tmp_path, second, references("seeded"))
    _assert_each_example_once_an_epoch(tmp_path)


def test_a_mark_is_written_once_a_pass_beside_the_backups_and_removed_with_them(tmp_path):
    """Backups every step write the weights; the pipeline's place goes to a file of its own once a pass, the one
    the latest backup names, and training's end removes it with the backup."""
    import json

    import keras
    import tensorflow as tf

    from conftest import tiny_data, tiny_model
    from trainer import Trainer
    from trainer.callbacks import BackupAndRestore

    seen = []

    class Look(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):  # the boundary before's backup is written by now
            if not (tmp_path / "backup.npz").exists():
                return
            with np.load(tmp_path / "backup.npz") as backup:
                named = json.loads(str(backup["state"]))["reading"]["mark"]["file"]
            files = sorted(p.name for p in tmp_path.glob("reader-*"))
            seen.append((files, named, (tmp_path / files[0]).stat().st_mtime_ns))

    x, y, _ = tiny_data(64)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64)
    Trainer(strategy="default", batch_size=16, verbose=0, steps_per_execution=1).fit(
        tiny_model(), data, epochs=2, callbacks=[BackupAndRestore(tmp_path, save_freq=1), Look()])
    # steps 1-3 of the first pass, then the first epoch's end, then steps 1-3 of the second pass
    assert len(seen) == 7 and all(files == [named] for files, named, _ in seen), seen
    names = [named for _, named, _ in seen]
    assert len(set(names[:4])) == 1 and len(set(names[4:])) == 1 and names[0] != names[4]  # one a pass
    assert len({written for _, _, written in seen[:4]}) == 1  # not rewritten by the pass's later backups
    assert not list(tmp_path.iterdir())  # the backup and its mark, removed when training completed


def test_a_missing_mark_file_resumes_from_the_pass_start_and_says_so(tmp_path):
    import keras
    import tensorflow as tf

    from conftest import tiny_data, tiny_model
    from trainer import Trainer
    from trainer.callbacks import BackupAndRestore

    class Stop(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("stopped")

    x, y, _ = tiny_data(64)
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(64, seed=2)
    trainer = Trainer(strategy="default", batch_size=16, verbose=0, steps_per_execution=1)
    with pytest.raises(RuntimeError, match="stopped"):
        trainer.fit(tiny_model(), data, epochs=1, callbacks=[BackupAndRestore(tmp_path, save_freq=1), Stop()])
    (mark,) = tmp_path.glob("reader-*")
    mark.unlink()
    with pytest.warns(UserWarning, match="the input pipeline's place that the backup names, is gone"):
        trainer.fit(tiny_model(), data, epochs=1, callbacks=[BackupAndRestore(tmp_path, save_freq=1)])


def test_a_dataset_function_says_where_its_place_holds():
    """Its pipelines are its input context's: exact on one worker, on that layout; on several workers, each
    of whose pipelines is its own, and with a pipeline of Python state, the plan says it is not exact."""
    import tensorflow as tf

    from trainer.data.pipeline_inputs import FunctionInput

    def fn(context):
        return tf.data.Dataset.range(64).shuffle(64).batch(8)

    one = FunctionInput(fn).resume(None, num_workers=1)
    assert not one.why_not and one.layout.startswith("on this layout") and "pass's start" in one.holds
    two = FunctionInput(fn).resume(None, num_workers=2)
    assert two.why_not == "a dataset function's pipelines start again from their first batch: each worker's " \
                          "pipeline is its own"

    def python_state(context):
        return tf.data.Dataset.range(64).map(lambda i: tf.py_function(lambda v: v, [i], tf.int64)).batch(8)

    assert "EagerPyFunc is stateful: state outside tf.data" in FunctionInput(python_state).resume(None).why_not


def test_a_backup_of_another_pipeline_is_refused_before_a_step():
    import tensorflow as tf

    from trainer.data import marks

    _, mark = marks.iterator_at(tf.data.Dataset.range(64).shuffle(64).batch(8), marks.Place(0, 0))
    other = tf.data.Dataset.range(64).map(lambda i: i * 2).batch(8)
    with pytest.raises(ValueError, match="the place of a tf.data pipeline other than this run's"):
        marks.iterator_at(other, marks.Place(0, 3, mark))
