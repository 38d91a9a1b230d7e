"""ArrayFeed: replicas read their slices straight from the arrays, exactly as the tf.data pipeline cuts them."""

import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored, tiny_data, tiny_model
from trainer import Trainer, arrays
from trainer import data as data_lib
from trainer import feed as feed_lib


def _feed(x, batch, replicas, order=None, **kwargs):
    inp = data_lib.as_input(x, arg="data")
    order = order or (lambda epoch: np.arange(inp.num_examples))
    return feed_lib.ArrayFeed(inp, order, global_batch_size=batch, num_replicas=replicas, **kwargs)


@pytest.mark.parametrize("examples,batch,replicas", [(1003, 64, 1), (1003, 64, 3), (37, 8, 4), (5, 8, 4)])
def test_replica_slices_match_the_dataset_pipeline(examples, batch, replicas):
    feed = _feed((np.zeros((examples, 1)), np.zeros(examples)), batch, replicas)
    starts, sizes = arrays.replica_slices(examples, batch, replicas)
    for step in range(len(starts)):
        got = [feed.replica_slice(step, r) for r in range(replicas)]
        assert [s for s, _, _ in got] == starts[step].tolist()
        assert [n for _, n, _ in got] == sizes[step].tolist()
        assert {c for _, _, c in got} == {int(sizes[step].sum())}  # the global count, known to every replica


def test_claims_stay_in_one_epoch_and_move_through_the_epochs():
    seen = []
    feed = _feed((np.zeros((100, 1)), np.zeros(100)), 16, 2, order=lambda e: seen.append(e) or np.arange(100),
                 epochs=range(3, 5), start_step=5)
    claims = [feed.claim(4) for _ in range(6)]
    # 7 steps per epoch: epoch 3 resumes at step 5, epoch 4 runs whole, then nothing is left.
    assert claims == [(5, 2), (0, 4), (4, 3), (0, 0), (0, 0), (0, 0)]
    assert seen == [3, 4]


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_replicas_gather_the_global_batch_in_the_epoch_order(replicas):
    n, batch = 37, 8
    x = {"a": np.arange(n, dtype=np.float32)[:, None] * np.ones((1, 3), np.float32), "b": np.arange(n)}
    y = -np.arange(n)
    order = np.random.default_rng(0).permutation(n)
    feed = _feed((x, y), batch, replicas, order=lambda epoch: order)
    strategy = mirrored(replicas) if replicas > 1 else tf.distribute.get_strategy()

    @tf.function
    def one_step(step):
        return strategy.run(lambda s: feed_lib.replica_batch(lambda: feed, s, feed.signature), args=(step,))

    rows_a, rows_b, labels, counts = [], [], [], []
    while True:
        step, count = feed.claim(1)
        if not count:
            break
        (xs, ys), global_count = one_step(tf.constant(step, tf.int64))
        local = strategy.experimental_local_results
        rows_a.extend(np.concatenate([t.numpy() for t in local(xs["a"])]).tolist())
        rows_b.extend(np.concatenate([t.numpy() for t in local(xs["b"])]).tolist())
        labels.extend(np.concatenate([t.numpy() for t in local(ys)]).tolist())
        counts.extend(float(c) for c in local(global_count))
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
    steps = trainer._engines[0].steps
    assert steps._train_from_feed.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("replicas", [1, 4])
def test_predict_reads_every_row_once_in_input_order(replicas):
    x, _, _ = tiny_data(203)  # 4 replicas: batches of 128, then 75 split 19/19/19/18
    strategy = mirrored(replicas) if replicas > 1 else "default"
    model = tiny_model()
    predictions = Trainer(strategy=strategy, per_replica_batch_size=32, verbose=0).predict(model, x)
    np.testing.assert_allclose(predictions, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_fit_through_the_feed_equals_fit_through_the_dataset_pipeline(monkeypatch):
    # Accelerators keep the tf.data pipeline for arrays; both paths must train identically.
    x, y, w = tiny_data(203)

    def run():
        trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0)
        history = trainer.fit(tiny_model(), (x, y, w), epochs=2, validation_data=(x, y))
        return history, trainer.evaluate(history.model, (x, y, w)), trainer.predict(history.model, x)

    fed = run()
    monkeypatch.setattr(feed_lib, "supports", lambda strategy: False)
    piped = run()
    for key, values in fed[0].history.items():
        np.testing.assert_allclose(values, piped[0].history[key], rtol=1e-6, err_msg=key)
    for a, b in zip(fed[0].model.get_weights(), piped[0].model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert fed[1] == pytest.approx(piped[1], rel=1e-6)
    np.testing.assert_allclose(fed[2], piped[2], rtol=1e-6, atol=1e-7)
