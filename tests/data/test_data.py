"""Input pipelines: the global order depends on the seed only; every example once per epoch."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored, tiny_data, tiny_model
from trainer import Trainer
from trainer.data import arrays
from trainer.data import boundary
from trainer.data import dataset_inputs
from trainer.data import inputs as inputs_lib


def test_epoch_order_depends_on_seed_and_epoch_only():
    a = arrays.epoch_order(100, shuffle=True, seed=3, epoch=1)
    np.testing.assert_array_equal(a, arrays.epoch_order(100, shuffle=True, seed=3, epoch=1))
    assert not np.array_equal(a, arrays.epoch_order(100, shuffle=True, seed=3, epoch=2))
    assert sorted(a) == list(range(100))
    np.testing.assert_array_equal(arrays.epoch_order(5, shuffle=False, seed=3, epoch=1), np.arange(5))


@pytest.mark.parametrize("replicas", [1, 2, 3, 4])
def test_replica_slices_cover_each_batch_contiguously(replicas):
    starts, sizes = arrays.replica_slices(1003, 64, replicas)
    assert starts.shape == (16, replicas)
    # Concatenating the slices in replica order gives back 0..1002.
    rows = np.concatenate([np.arange(s, s + n) for s, n in zip(starts.ravel(), sizes.ravel())])
    np.testing.assert_array_equal(rows, np.arange(1003))
    assert sizes[-1].sum() == 1003 - 15 * 64 and sizes[-1].max() - sizes[-1].min() <= 1


def test_replica_slices_resume_mid_epoch():
    starts, sizes = arrays.replica_slices(100, 16, 2, start_step=5)
    assert starts[0, 0] == 80 and sizes.sum() == 20


@pytest.mark.parametrize("replicas,examples", [(2, 37), (4, 37), (4, 35)])  # 35: a last batch of 3 for 4
def test_each_replica_gets_its_slice_of_the_global_batch(replicas, examples):
    x = np.arange(examples, dtype=np.float32)[:, None]
    inp = boundary.as_input((x, x), arg="data")
    order = arrays.epoch_order(examples, shuffle=True, seed=0, epoch=0)
    strategy = mirrored(replicas)
    fn = arrays.array_dataset_fn(inp.host(), inp.num_examples, lambda epoch: order, 8, range(1))
    dataset = strategy.distribute_datasets_from_function(fn)
    seen = []
    for rows, _, tracked, _ in dataset:  # each replica's Share: its rows, and the ones it counts
        parts, counted = strategy.experimental_local_results(rows[0]), strategy.experimental_local_results(tracked)
        seen.extend(np.concatenate([p.numpy()[b:e, 0] for p, (b, e) in zip(parts, counted)]).astype(int).tolist())
    assert seen == order.tolist()  # every example once, in the global order


def test_float64_arrays_become_float32_and_lengths_are_checked():
    inp = boundary.as_input((np.zeros((4, 2)), np.zeros(4, np.int64)), arg="data")
    assert inp.arrays[0].dtype == np.float32 and inp.arrays[1].dtype == np.int64
    assert inp.num_examples == 4
    with pytest.raises(ValueError, match=r"leading example dimension"):
        boundary.as_input((np.float32(1.0), np.zeros(4)), arg="data")


def test_dict_inputs_and_missing_sample_weight():
    inp = boundary.as_input(({"a": np.zeros((5, 2)), "b": np.ones((5,))}, np.zeros(5), None), arg="data")
    assert len(inp.arrays) == 2 and set(inp.arrays[0]) == {"a", "b"}


def test_shard_policy_is_explicit_and_respects_the_user():
    ds = tf.data.Dataset.range(10)
    policy = tf.data.experimental.AutoShardPolicy
    assert dataset_inputs.shard_policy(ds, 1)[0] == policy.OFF
    assert dataset_inputs.shard_policy(ds, 2)[0] == policy.DATA
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy.FILE
    assert dataset_inputs.shard_policy(ds.with_options(options), 2) == (policy.FILE, "set on the dataset by the user")


def test_sharding_says_who_splits_each_kind_of_input():
    arrays_in = boundary.as_input((np.zeros(8), np.zeros(8)), arg="d")
    dataset_in = boundary.as_input(tf.data.Dataset.range(8).map(lambda i: (i, i)), arg="d")
    function_in = boundary.as_input(lambda ctx: tf.data.Dataset.range(8).map(lambda i: (i, i)), arg="d")
    assert arrays_in.sharding(2)[0] == "OFF"
    assert dataset_in.sharding(1)[0] == "OFF"
    assert dataset_in.sharding(2)[0] == "DATA"
    assert function_in.sharding(2)[0] == "per worker"
    assert dataset_in.sharding(2, parameter_server=True)[0] == "per worker"


def test_num_steps():
    assert boundary.as_input((np.zeros(65), np.zeros(65)), arg="d").num_steps(32) == 3
    assert boundary.as_input(tf.data.Dataset.range(64).map(lambda i: (i, i)), arg="d").num_steps(32) == 2
    unknown = tf.data.Dataset.range(64).filter(lambda i: i > 3).map(lambda i: (i, i))
    assert boundary.as_input(unknown, arg="d").num_steps(32) is None


@pytest.mark.parametrize("steps_per_epoch, seen", [
    (4, [range(0, 40), range(40, 80), range(80, 100)]),  # runs out mid-epoch: the epoch ends there, as Keras's
    (5, [range(0, 50), range(50, 100), range(0, 50)]),  # runs out at an epoch's end: the next reads a new pass
])
@pytest.mark.slow
def test_a_dataset_with_steps_per_epoch_is_one_stream_whose_end_ends_an_epoch(steps_per_epoch, seen):
    import keras

    from conftest import tiny_model

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(100, 8)).astype("float32"), rng.integers(0, 3, 100)
    model = tiny_model()
    model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = Trainer(strategy="default", batch_size=10, lr_scaling=None, verbose=0)
    history = trainer.fit(model, tf.data.Dataset.from_tensor_slices((x, y)), epochs=3,
                          steps_per_epoch=steps_per_epoch)
    assert int(history.model.optimizer.iterations.numpy()) == sum(len(rows) for rows in seen) // 10
    # The weights never move (LR 0), so each epoch's loss is the loss over the examples it read.
    expected = [trainer.evaluate(model, (x[list(rows)], y[list(rows)]), return_dict=True)["loss"] for rows in seen]
    np.testing.assert_allclose(history.history["loss"], expected, rtol=1e-5)


def _shuffled_labels():
    return tf.data.Dataset.range(37).map(lambda i: (tf.cast(i, tf.float32)[None], i)).shuffle(37, seed=3)


def test_on_cpu_replicas_a_dataset_is_read_as_global_batches_each_epoch_a_whole_pass(monkeypatch):
    """No distributed iterator: one plain iterator of global batches per epoch, each the pass a plain
    loop reads (a seeded shuffle reshuffles each pass), which the steps split among the replicas."""
    from trainer.data import readers as readers_lib

    plain = _shuffled_labels()
    expected = [[int(i) for _, i in plain] for _ in range(3)]
    strategy = mirrored(2)
    monkeypatch.setattr(strategy, "experimental_distribute_dataset", None)  # calling it would fail
    readers = inputs_lib.Readers(strategy, 8, shuffle=True, seed=0)
    inp = boundary.as_input(_shuffled_labels(), arg="data")
    for epoch, order in enumerate(expected):
        reader = readers(inp, epoch=epoch)
        assert isinstance(reader, readers_lib.GlobalBatches)
        batches = [labels.numpy().tolist() for _, labels in reader.iterator]
        assert [len(b) for b in batches] == [8, 8, 8, 8, 5]
        assert sum(batches, []) == order, epoch
    assert expected[0] != expected[1] and sorted(expected[0]) == list(range(37))


def test_replica_share_cuts_a_global_batch_as_the_feed_does():
    from trainer.data import feed as feed_lib

    strategy = mirrored(3)
    for size in [1, 2, 5, 8, 11]:
        batch = tf.range(size, dtype=tf.int64)
        shares = strategy.run(lambda b: feed_lib.share_of(b), args=(batch,))
        starts, sizes, begins, ends = arrays.computed_slices(size, size, 3)
        local = strategy.experimental_local_results
        for replica, (part, count, (begin, end)) in enumerate(zip(local(shares.batch), local(shares.global_count),
                                                                  zip(*map(local, shares.tracked)))):
            start, n = int(starts[0, replica]), int(sizes[0, replica])
            assert part.numpy().tolist() == list(range(start, start + n)), (size, replica)
            assert float(count) == size * (3 if size < 3 else 1)
            assert (int(begin), int(end)) == (begins[0, replica], ends[0, replica])
        # The tracked rows are arrays.replica_slices' shares: each example counted once.
        counted = [part.numpy()[int(b):int(e)].tolist() for part, b, e in
                   zip(local(shares.batch), local(shares.tracked[0]), local(shares.tracked[1]))]
        assert sum(counted, []) == list(range(size)), size


def test_on_accelerators_a_dataset_is_distributed_once_and_each_epoch_reads_a_whole_pass(monkeypatch):
    """Where the steps cannot split host batches (accelerators, several workers), TF's distributed
    iterator reads the dataset; distributing it, which rewrites its graph, happens once per fit."""
    from trainer.data import readers as readers_lib

    monkeypatch.setattr(readers_lib, "reads_in_step", lambda strategy: False)  # as on GPUs
    plain = _shuffled_labels()
    expected = [[int(i) for _, i in plain] for _ in range(3)]
    strategy = mirrored(2)
    distribute_calls = []
    original = strategy.distribute_datasets_from_function
    monkeypatch.setattr(strategy, "distribute_datasets_from_function",
                        lambda *args, **kwargs: distribute_calls.append(1) or original(*args, **kwargs))
    inp = boundary.as_input(_shuffled_labels(), arg="data")
    readers = inputs_lib.Readers(strategy, 8, shuffle=True, seed=0)
    for epoch, order in enumerate(expected):
        seen = []
        reader = readers(inp, epoch=epoch)
        assert isinstance(reader, readers_lib.DistributedBatches)
        for cut in reader.iterator:  # each replica's share, cut by the trainer, and the rows it counts
            labels, tracked = (strategy.experimental_local_results(part) for part in (cut.batch[1], cut.tracked))
            seen.extend(np.concatenate([p.numpy()[b:e] for p, (b, e) in zip(labels, tracked)]).tolist())
        assert seen == order, epoch
    assert expected[0] != expected[1] and sorted(expected[0]) == list(range(37))
    assert len(distribute_calls) == 1


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_dataset_batch_of_another_shape_waits_for_the_next_step_call(replicas):
    """30 examples in global batches of 12: the last batch of 6 is held back from the call that read it.

    The dataset's length is unknown (a filter), so the plan can't cut the calls at the uneven step.
    """
    x, y, _ = tiny_data(30)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda *_: True)
    strategy = mirrored(replicas) if replicas > 1 else "default"
    trainer = Trainer(strategy=strategy, batch_size=12, steps_per_execution=8, lr_scaling=None, verbose=0)
    model = tiny_model()
    trainer.fit(model, dataset)  # builds the engine
    steps = trainer._runs.engines[0].steps
    traced, calls = steps._train_loops.global_batches, []

    def recorded(iterator, held, num_steps):
        calls.append(bool(held.has_value()))
        executed, kept = traced(iterator, held, num_steps)
        calls.append(int(executed))
        return executed, kept

    steps._train_loops = dataclasses.replace(steps._train_loops, global_batches=recorded)
    history = trainer.fit(model, dataset, epochs=2)
    # Per epoch: a call runs the two full steps and reads the third; the next starts with it.
    assert calls == [False, 2, True, 1] * 2
    assert traced.experimental_get_tracing_count() == 1
    reference = tiny_model()
    reference.fit(dataset.batch(12), epochs=1, verbose=0)
    keras_history = reference.fit(dataset.batch(12), epochs=2, verbose=0)
    np.testing.assert_allclose(history.history["loss"], keras_history.history["loss"], rtol=1e-5)
