"""ArrayFeed: replicas read their slices straight from the arrays, exactly as the tf.data pipeline cuts them."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored, tiny_data, tiny_model
from trainer import Trainer
from trainer.data import boundary
from trainer.data import feed as feed_lib
from trainer.data import readers as readers_lib


def _feed(x, batch, replicas, order=None, **kwargs):
    inp = boundary.as_input(x, arg="data")
    order = order or (lambda epoch: np.arange(inp.num_examples))
    return readers_lib.ArrayFeed(inp.arrays, order, global_batch_size=batch, num_replicas=replicas, **kwargs)


@pytest.mark.parametrize("examples,batch,replicas", [(1003, 64, 1), (1003, 64, 3), (37, 8, 4), (5, 8, 4), (33, 8, 3)])
def test_replica_rows_are_the_dataset_pipelines_slices(examples, batch, replicas):
    order = np.random.default_rng(1).permutation(examples)
    x = np.arange(examples, dtype=np.float32)[:, None]
    feed = _feed((x, -x), batch, replicas, order=lambda epoch: order)
    feed.claim(1)
    steps = -(-examples // batch)
    for replica in range(replicas):
        for first, count in [(0, steps), (steps - 1, 1), (0, min(2, steps))]:
            xs, ys, bounds, counts, tracked = feed.replica_rows(first, count, replica)
            for i, step in enumerate(range(first, first + count)):
                # The replica's contiguous share of the global batch, as arrays.replica_slices computes it.
                begin = step * batch
                size = min(batch, examples - begin)
                share = [size // replicas + (r < size % replicas) for r in range(replicas)]
                start = begin + sum(share[:replica])
                expected = order[start : start + share[replica]]
                rows = slice(bounds[i], bounds[i + 1])
                if size < replicas:  # every replica computes the whole batch and counts its own share
                    np.testing.assert_array_equal(xs[rows, 0], order[begin : begin + size])
                    assert counts[i] == size * replicas
                else:
                    np.testing.assert_array_equal(xs[rows, 0], order[start : start + share[replica]])
                    assert counts[i] == size  # the step's global count, known to every replica
                np.testing.assert_array_equal(xs[rows, 0][tracked[i, 0] : tracked[i, 1]], expected)
                np.testing.assert_array_equal(ys[rows, 0][tracked[i, 0] : tracked[i, 1]], -expected)
            assert bounds[-1] == len(xs)


def test_a_call_never_mixes_steps_of_different_shapes():
    # 8 steps of 16 (8 per replica) and a last step of 3 (2 and 1): the last one gets a call of its own.
    feed = _feed((np.zeros((131, 2)), np.zeros(131)), 16, 2)
    assert list(feed.fetches(100)) == [(0, 8), (8, 1)]
    # A last step of 1 example on 3 replicas is computed whole by each: still its own call.
    feed = _feed((np.zeros((33, 2)), np.zeros(33)), 16, 3)
    assert list(feed.fetches(100)) == [(0, 2), (2, 1)]
    feed = _feed((np.zeros((32, 2)), np.zeros(32)), 16, 3)
    assert list(feed.fetches(100)) == [(0, 2)]


def test_fetches_split_a_claim_by_bytes():
    x = np.zeros((1000, 1024), np.float32)  # 4 KiB per example, 64 KiB per step of 16
    feed = _feed((x, np.zeros(1000)), 16, 2)
    assert feed.steps_per_fetch == readers_lib.FETCH_BYTES // (16 * (4096 + 8))
    feed.steps_per_fetch = 3
    assert list(feed.fetches(8)) == [(0, 3), (3, 3), (6, 2)]
    assert list(feed.fetches(100)) == [(8, 3), (11, 3), (14, 3), (17, 3), (20, 3), (23, 3), (26, 3), (29, 3),
                                        (32, 3), (35, 3), (38, 3), (41, 3), (44, 3), (47, 3), (50, 3), (53, 3),
                                        (56, 3), (59, 3), (62, 1)]  # up to the end of the epoch: 63 steps
    assert list(feed.fetches(4)) == []  # one epoch only


def test_claims_stay_in_one_epoch_and_move_through_the_epochs():
    seen = []
    feed = _feed((np.zeros((100, 1)), np.zeros(100)), 16, 2, order=lambda e: seen.append(e) or np.arange(100),
                 epochs=range(3, 5), start_step=5)
    claims = [feed.claim(4) for _ in range(6)]
    # 7 steps per epoch: epoch 3 resumes at step 5, epoch 4 runs whole, then nothing is left.
    assert claims == [(5, 2), (0, 4), (4, 3), (0, 0), (0, 0), (0, 0)]
    assert seen == [3, 4]


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_replicas_gather_the_global_batch_in_the_epoch_order(replicas):
    n, batch = 37, 8
    x = {"a": np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32), "b": np.arange(n)}
    y = -np.arange(n)
    order = np.random.default_rng(0).permutation(n)
    feed = _feed((x, y), batch, replicas, order=lambda epoch: order)
    strategy = mirrored(replicas) if replicas > 1 else tf.distribute.get_strategy()

    @tf.function
    def one_call(first, count):  # count: a Python int
        fetched = strategy.run(lambda: feed_lib.fetch(lambda: feed, first, tf.constant(count, tf.int64),
                                                      feed.signature))
        return [strategy.run(lambda f: feed_lib.step_batch(f, i, feed.signature), args=(fetched,))
                for i in range(count)]

    rows_a, rows_b, labels, counts = [], [], [], []
    for step_count in (2, 3):  # two calls: steps 0-1, then 2-4
        first, count = feed.claim(step_count)
        for (xs, ys), global_count, _, _ in one_call(tf.constant(first, tf.int64), count):
            local = strategy.experimental_local_results
            rows_a.extend(np.concatenate([t.numpy() for t in local(xs["a"])]).tolist())
            rows_b.extend(np.concatenate([t.numpy() for t in local(xs["b"])]).tolist())
            labels.extend(np.concatenate([t.numpy() for t in local(ys)]).tolist())
            counts.extend(float(c) for c in local(global_count))
    assert feed.claim(1) == (0, 0)
    np.testing.assert_array_equal(np.array(rows_a), x["a"][order])
    np.testing.assert_array_equal(rows_b, order)
    np.testing.assert_array_equal(labels, -order)
    # Every replica knows the step's global count: 8 per full batch, 5 in the last one.
    assert counts == [8.0] * (4 * replicas) + [5.0] * replicas


def test_fits_on_new_arrays_of_the_same_shape_reuse_the_traced_steps():
    x, y, _ = tiny_data(200)
    trainer = Trainer(per_replica_batch_size=32, verbose=0)
    model = tiny_model()
    trainer.fit(model, (x, y), epochs=2)
    trainer.fit(model, (x[:150] + 1, y[:150]), epochs=1)
    steps = trainer._runs.engines[0].steps
    assert steps._train_loops.feed.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("reader", ["feed", "accelerator"])
def test_arrays_in_whole_batches_train_bit_for_bit_as_model_fit_on_one_device(reader, monkeypatch):
    # Keras's arrays give its step a static batch size when they split into whole batches, and TensorFlow
    # computes the gradient of a Dense on a sequence otherwise with it (an unknown size was 1e-9 off at the
    # first step, and BatchNormalization with Adam grew that to 1e-2 in three epochs of keras.io's
    # timeseries classifier). The feed, and the pipeline accelerators read, give the step the same size.
    import keras

    if reader == "accelerator":
        monkeypatch.setattr(readers_lib, "reads_in_step", lambda strategy: False)

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 50, 1)).astype(np.float32), rng.integers(0, 2, 128)

    def build():
        keras.utils.set_random_seed(0)
        inputs = keras.Input((50, 1))
        hidden = keras.layers.GlobalAveragePooling1D()(keras.layers.Dense(16, activation="relu")(inputs))
        model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(hidden))
        model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy")
        return model

    reference, ours = build(), build()
    reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    Trainer(verbose=0).fit(ours, x, y, batch_size=32, epochs=2, shuffle=False)
    for theirs, mine in zip(reference.get_weights(), ours.get_weights()):
        np.testing.assert_array_equal(mine, theirs)


def test_the_static_batch_size_is_there_only_when_every_step_has_the_same_rows():
    x = np.zeros((96, 3), np.float32)
    assert _feed(x, 32, 1).signature[2] == 32
    assert _feed(x, 32, 2).signature[2] == 16
    assert _feed(x, 32, 3).signature[2] is None  # shares of 11, 11 and 10
    assert _feed(x[:90], 32, 1).signature[2] is None  # a last step of 26, as Keras's own arrays have then


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 4])
def test_predict_reads_every_row_once_in_input_order(replicas):
    x, _, _ = tiny_data(203)  # 4 replicas: batches of 128, then 75 split 19/19/19/18
    strategy = mirrored(replicas) if replicas > 1 else "default"
    model = tiny_model()
    predictions = Trainer(strategy=strategy, per_replica_batch_size=32, verbose=0).predict(model, x)
    np.testing.assert_allclose(predictions, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_fit_through_the_feed_equals_fit_through_the_dataset_pipeline(monkeypatch):
    # Accelerators keep the tf.data pipeline for arrays; both paths must train identically.
    x, y, w = tiny_data(203)

    def run():
        trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0)
        history = trainer.fit(tiny_model(), (x, y, w), epochs=2, validation_data=(x, y))
        return history, trainer.evaluate(history.model, (x, y, w), return_dict=True), trainer.predict(history.model, x)

    fed = run()
    monkeypatch.setattr(readers_lib, "reads_in_step", lambda strategy: False)
    piped = run()
    for key, values in fed[0].history.items():
        np.testing.assert_allclose(values, piped[0].history[key], rtol=1e-6, err_msg=key)
    for a, b in zip(fed[0].model.get_weights(), piped[0].model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert fed[1] == pytest.approx(piped[1], rel=1e-6)
    np.testing.assert_allclose(fed[2], piped[2], rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_fit_is_the_same_when_each_call_is_split_into_several_gathers(monkeypatch):
    x, y, w = tiny_data(203)

    def run():
        trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, steps_per_execution=5, verbose=0)
        history = trainer.fit(tiny_model(), (x, y, w), epochs=2, validation_data=(x, y))
        return history, trainer._runs.engines[0].steps._train_loops.feed.experimental_get_tracing_count()

    whole, _ = run()
    monkeypatch.setattr(readers_lib, "FETCH_BYTES", 1)  # one step per gather: 5 gathers per claim of 5 steps
    split, traces = run()
    assert traces == 1  # the traced loop takes any step count
    for key, values in whole.history.items():
        np.testing.assert_allclose(values, split.history[key], rtol=1e-6, err_msg=key)
    for a, b in zip(whole.model.get_weights(), split.model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_where_tf_data_splits_arrays_the_uneven_last_step_gets_a_call_of_its_own(monkeypatch):
    monkeypatch.setattr(readers_lib, "reads_in_step", lambda strategy: False)  # as on GPUs: TF's distributed iterator
    x, y, _ = tiny_data(30)  # global batches of 12: steps of 12, 12 and 6
    trainer = Trainer(strategy=mirrored(2), batch_size=12, steps_per_execution=8, lr_scaling=None, verbose=0)
    model = tiny_model()
    trainer.fit(model, (x, y))
    steps = trainer._runs.engines[0].steps
    traced, calls = steps._train_loops.distributed, []
    steps._train_loops = dataclasses.replace(
        steps._train_loops, distributed=lambda iterator, n: calls.append(int(n)) or traced(iterator, n))
    trainer.fit(model, (x, y), epochs=2)
    assert calls == [2, 1, 2, 1]
