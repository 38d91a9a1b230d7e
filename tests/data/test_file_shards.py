"""Trainer(data_sharding="files"): each worker reads its file shards, and every layout gets the same numbers.

TFRecord files read as a user's pipeline reads them (tests/scripts/file_shards_run.py), with 8 file shards, on 1, 2,
4 and 8 replicas in one process and on 2 workers of 1 and 2 replicas (trainer-launch): history (keys too),
evaluate, weights and predictions must agree with the one-replica run, and each worker must read about its
share of the files' bytes. The refusals run in-process.
"""


import numpy as np
import pytest
import tensorflow as tf

from conftest import FULL, load_run, mirrored, run_script, SCRIPTS, tiny_model
from trainer import Trainer

pytestmark = pytest.mark.slow  # subprocesses, layouts or whole trainings: not in the everyday tier

SCRIPT = str(SCRIPTS / "file_shards_run.py")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    run_script(SCRIPT, folder, "--write")
    return folder


@pytest.fixture(scope="module")
def one_replica(files, tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    proc = run_script(SCRIPT, files, out)
    assert "sharding       FILE: 8 file shards, 8 per worker: each worker reads all of the files" in proc.stdout
    return load_run(out, "single0")


def _assert_same(result, arrays, reference):
    expected, expected_arrays = reference
    assert sorted(result["history"]) == sorted(expected["history"])
    for key, values in expected["history"].items():
        np.testing.assert_allclose(result["history"][key], values, rtol=1e-5, err_msg=key)
    for key, value in expected["evaluate"].items():
        np.testing.assert_allclose(result["evaluate"][key], value, rtol=1e-5, err_msg=key)
    assert result["iterations"] == expected["iterations"] == 14
    for key in ("weights", "predictions"):
        np.testing.assert_allclose(arrays[key], expected_arrays[key], rtol=1e-5, atol=1e-6, err_msg=key)


@pytest.mark.parametrize("replicas", [2, 4, 8] if FULL else [2, 8])
def test_replicas_in_one_process_give_the_one_replica_numbers(files, one_replica, tmp_path, replicas):
    run_script(SCRIPT, files, tmp_path, "--replicas", replicas)
    _assert_same(*load_run(tmp_path, "single0"), one_replica)


@pytest.mark.parametrize("replicas", [1, 2])
def test_two_workers_give_the_one_replica_numbers_and_read_half_the_files_each(files, one_replica, tmp_path,
                                                                                replicas):
    proc = run_script(SCRIPT, files, tmp_path, "--replicas", replicas, launch=("--workers", "2"))
    assert "sharding       FILE: 8 file shards, 4 per worker: each worker reads 1/2 of the files" in proc.stdout
    single_read = one_replica[0]["read_bytes"]
    for task in ("worker0", "worker1"):
        result, arrays = load_run(tmp_path, task)
        _assert_same(result, arrays, one_replica)
        # Each worker reads its 8 of the 16 files: about half the bytes one process reads for the same steps.
        assert 0.4 * single_read < result["read_bytes"] < 0.6 * single_read, (result["read_bytes"], single_read)


def _tfrecord_dataset(folder, files=4, batch=16):
    rng = np.random.default_rng(0)
    names = []
    for f in range(files):
        name = str(folder / f"part-{f}.tfrecord")
        with tf.io.TFRecordWriter(name) as writer:
            for _ in range(8):
                x = rng.normal(size=8).astype("float32")
                feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                           "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x[0] > 0)]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        names.append(name)
    spec = {"x": tf.io.FixedLenFeature([8], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        example = tf.io.parse_single_example(record, spec)
        return example["x"], example["y"]

    return tf.data.TFRecordDataset(names).map(parse).batch(batch)


def _unchanged(model, call):
    before = [v.numpy() for v in model.weights]
    call()
    for value, variable in zip(before, model.weights):
        np.testing.assert_array_equal(value, variable.numpy())


def test_without_steps_per_epoch_it_is_refused(tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match=r"`steps_per_epoch` must be given with Trainer\(data_sharding='files'\)"):
        _unchanged(model, lambda: Trainer(data_sharding="files", file_shards=4, verbose=0).fit(
            model, _tfrecord_dataset(tmp_path)))


def test_shards_that_do_not_divide_the_batch_or_that_the_replicas_do_not_divide_are_refused(tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match="Received: file_shards=3 with a global batch of 16 on 2 replica"):
        Trainer(strategy=mirrored(2), data_sharding="files", file_shards=3, verbose=0).fit(
            model, _tfrecord_dataset(tmp_path), steps_per_epoch=2)


def test_a_dataset_with_fewer_files_than_shards_is_refused_before_training(tmp_path):
    model = tiny_model()
    with pytest.raises(ValueError, match="its file shard 7 of 8 can't be read: it is empty"):
        _unchanged(model, lambda: Trainer(data_sharding="files", file_shards=8, verbose=0).fit(
            model, _tfrecord_dataset(tmp_path, files=4), steps_per_epoch=2))


def test_a_dataset_read_from_memory_is_refused_with_the_fix(data):
    x, y, _ = data
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(ValueError, match="reads a dataset by its files") as err:
        Trainer(data_sharding="files", file_shards=2, verbose=0).fit(tiny_model(), dataset, steps_per_epoch=2)
    assert "data_sharding='exact'" in str(err.value)


def test_a_bad_data_sharding_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"Received: data_sharding='file'"):
        Trainer(data_sharding="file")
