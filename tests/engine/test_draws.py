"""trainer/engine/draws.py: a replica's random draws are its rows of the draw one device makes for the global batch."""

import warnings
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored
from trainer.engine import draws


def _per_replica_draws(strategy, draw, global_rows: int, philox: bool = True, dynamic: bool = False):
    """What `draw(rows)` gives each replica of `strategy` when a global batch of `global_rows` is cut in order
    (`dynamic`: with the rows known only when the step runs, as the trainer cuts arrays)."""
    replicas = strategy.num_replicas_in_sync
    sizes = [global_rows // replicas + (r < global_rows % replicas) for r in range(replicas)]
    firsts = np.cumsum([0] + sizes[:-1])

    @tf.function(input_signature=[tf.TensorSpec([replicas], tf.int64)])
    def step(given_sizes):
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            rows = tf.gather(given_sizes if dynamic else tf.constant(sizes, tf.int64), r)  # a constant folds
            batch = tf.zeros(tf.stack([rows, 1]))
            with draws.hooks(), draws.replica_rows(batch, (tf.gather(tf.constant(firsts, tf.int64), r),
                                                           tf.constant(global_rows, tf.int64))):
                return draw(tf.shape(batch)[0])
        return strategy.run(replica_fn)

    with mock.patch.object(draws, "_philox", lambda: philox):  # False: the draw a TPU's generator takes
        return [t.numpy() for t in strategy.experimental_local_results(step(tf.constant(sizes, tf.int64)))]


DRAWS = {
    "uniform": lambda rows: keras.random.uniform((rows, 3), minval=-1.0, maxval=2.0, seed=7),
    "normal": lambda rows: keras.random.normal((rows, 5), mean=1.0, stddev=2.0, seed=7),
    "randint": lambda rows: keras.random.randint((rows, 3), 0, 100, seed=7),
    "truncated_normal": lambda rows: keras.random.truncated_normal((rows, 3), seed=7),
    "dropout": lambda rows: keras.random.dropout(tf.ones(tf.stack([rows, 6])), 0.4, seed=7),
    "spatial_dropout": lambda rows: keras.random.dropout(tf.ones(tf.stack([rows, 2, 3])), 0.5,
                                                         noise_shape=(None, 1, 3), seed=7),
    "float64": lambda rows: keras.random.uniform((rows, 3), dtype="float64", seed=7),
}


@pytest.mark.parametrize("philox", [True, False], ids=["counter", "global_draw"])
@pytest.mark.parametrize("name", list(DRAWS))
@pytest.mark.parametrize("replicas,rows", [(2, 9), (3, 7), (4, 3)])
def test_each_replica_draws_its_rows_of_the_one_device_draw(name, replicas, rows, philox):
    one_device = DRAWS[name](rows).numpy()
    parts = _per_replica_draws(mirrored(replicas), DRAWS[name], rows, philox)
    assert np.array_equal(np.concatenate(parts), one_device)


def test_a_draw_that_is_not_per_example_is_the_same_on_every_replica():
    one_device = keras.random.normal((4, 2), seed=3).numpy()  # four rows, static: not the replicas' 5
    parts = _per_replica_draws(mirrored(2), lambda rows: keras.random.normal((4, 2), seed=3), 10)
    for part in parts:
        assert np.array_equal(part, one_device)
    scalar = keras.random.uniform((), seed=3).numpy()
    for part in _per_replica_draws(mirrored(2), lambda rows: keras.random.uniform((), seed=3), 10):
        assert part == scalar


def _stacked(rows, parts: int = 2):
    """A tensor made as keras.io's GAN labels are: `parts` parts of `rows` rows, concatenated."""
    return keras.ops.concatenate([tf.fill(tf.stack([rows, 3]), float(j)) for j in range(parts)], axis=0)


STACKED = {
    "uniform": lambda t: keras.random.uniform(keras.ops.shape(t), seed=7),
    "normal": lambda t: keras.random.normal(tf.shape(t), seed=7),
    "randint": lambda t: keras.random.randint(tf.shape(t), 0, 100, seed=7),
    "truncated_normal": lambda t: keras.random.truncated_normal(keras.ops.shape(t), seed=7),
    "dropout": lambda t: keras.random.dropout(t, 0.4, seed=7),
}


def _stacked_cases():
    """CI's tier: every kind on 2 replicas with sizes known when the step runs, and with static sizes on 3; the
    full tier: every kind, both ways of drawing and both layouts, each way."""
    for replicas, rows, parts in [(2, 9, 2), (3, 7, 3)]:
        for name in STACKED:
            for philox in (True, False):
                for dynamic in (True, False):
                    everyday = philox and dynamic == (replicas == 2)
                    yield pytest.param(name, replicas, rows, parts, philox, dynamic, marks=() if everyday else
                                       pytest.mark.full, id=f"{name}-{replicas}x{parts}-"
                                       f"{'counter' if philox else 'global_draw'}-{'dynamic' if dynamic else 'static'}")


@pytest.mark.parametrize("name, replicas, rows, parts, philox, dynamic", _stacked_cases())
def test_a_draw_shaped_like_a_concatenation_of_the_replicas_rows_takes_each_parts_rows(name, replicas, rows, parts,
                                                                                      philox, dynamic):
    one_device = STACKED[name](_stacked(rows, parts)).numpy()
    got = _per_replica_draws(mirrored(replicas), lambda n: STACKED[name](_stacked(n, parts)), rows, philox, dynamic)
    sizes = [rows // replicas + (r < rows % replicas) for r in range(replicas)]
    firsts = np.cumsum([0] + sizes[:-1])
    for part, first, size in zip(got, firsts, sizes):
        want = np.concatenate([one_device[j * rows + first:j * rows + first + size] for j in range(parts)])
        assert np.array_equal(part, want)


class LabelNoiseGAN(keras.Model):
    """keras.io's GAN step, reduced: label noise drawn over the generated and the real rows together."""

    def __init__(self, noise: str):
        super().__init__()
        self.noise = noise
        self.discriminator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        self.seed_generator = keras.random.SeedGenerator(3)

    def call(self, x):
        return self.discriminator(x)

    def train_step(self, data):
        real = data[0] if isinstance(data, tuple) else data
        count = keras.ops.shape(real)[0]
        labels = keras.ops.concatenate([keras.ops.ones((count, 1)), keras.ops.zeros((count, 1))], axis=0)
        if self.noise == "labels":  # keras.io: one draw shaped like the labels, the generated rows' then the real
            labels += 0.05 * keras.random.uniform(keras.ops.shape(labels), seed=self.seed_generator)
        elif self.noise == "tf.shape":
            labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
        else:  # twice the rows, not made by a concatenation: no replica's rows are a slice of one device's draw
            labels += 0.05 * keras.random.uniform((2 * count, 1), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            logits = self.discriminator(keras.ops.concatenate([real * 0.5, real], axis=0))
            loss = keras.ops.mean(keras.losses.binary_crossentropy(labels, logits, from_logits=True))
        grads = tape.gradient(loss, self.discriminator.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        return {"loss": loss}


@pytest.mark.parametrize("noise, replicas, examples, warned", [
    ("doubled", 2, 16, 1), ("doubled", 2, 15, 1), ("doubled", 1, 16, 0), ("labels", 2, 15, 0)])
def test_a_draw_over_the_data_that_is_not_the_replicas_rows_is_named_once(noise, replicas, examples, warned,
                                                                          capsys):
    """Named in a warning when the step first traces (16 examples in batches of 8: sizes static) or runs (15:
    sizes known only then), and in the plan's row of the model's next fit."""
    from trainer import Trainer

    model = LabelNoiseGAN(noise)
    model.compile(optimizer="sgd")
    x = np.random.default_rng(0).normal(size=(examples, 3)).astype("float32")
    trainer = Trainer(strategy=mirrored(replicas), batch_size=8, verbose=1)
    plans = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # each text once, as a user sees it
        for _ in range(2):
            trainer.fit(model, x, epochs=2, verbose=1)
            plans.append(capsys.readouterr().out.split("Epoch 1/2")[0])
    named = [w for w in caught if "A random draw in the step has 8 rows" in str(w.message)]
    assert len(named) == warned, [str(w.message) for w in caught]
    rows = [[line for line in plan.splitlines() if line.strip().startswith("random draws")] for plan in plans]
    assert rows[0] == []  # the plan prints before the step is traced
    if warned:
        assert named[0].filename == __file__  # the user's line: the draw in train_step
        assert len(rows[1]) == 1, plans[1]
        assert f"test_draws.py:{named[0].lineno} draws 8 rows where a replica has 4" in rows[1][0], rows[1]
    else:
        assert rows[1] == [], plans[1]


@pytest.mark.parametrize("noise, form, replicas", [
    ("labels", "arrays", 2), ("tf.shape", "arrays", 3), ("labels", "static_dataset", 3),
    *[pytest.param(n, f, r, marks=pytest.mark.full) for n, f, r in [
        ("labels", "arrays", 3), ("tf.shape", "arrays", 2), ("labels", "static_dataset", 2),
        ("tf.shape", "static_dataset", 2), ("tf.shape", "static_dataset", 3)]]])
def test_label_noise_drawn_over_the_generated_and_the_real_rows_gives_one_devices_numbers(noise, form, replicas):
    """A draw shaped like a concatenation of parts that are each the replica's rows takes, part by part, the
    replica's rows of one device's draw: 15 arrays' examples in batches of 6 (an uneven last batch of 3, sizes
    known when the step runs), or a dataset of batches of 6 with drop_remainder (static sizes)."""
    from trainer import Trainer

    x = np.random.default_rng(1).normal(size=(15, 3)).astype("float32")
    data = x if form == "arrays" else tf.data.Dataset.from_tensor_slices(x).batch(6, drop_remainder=True)
    batch_size = 6 if form == "arrays" else None
    runs = []
    for trainer in (None, Trainer(strategy=mirrored(replicas), batch_size=6, verbose=0, shuffle=False)):
        keras.utils.set_random_seed(4)
        model = LabelNoiseGAN(noise)
        model.compile(optimizer=keras.optimizers.SGD(0.5))
        if trainer is None:
            history = model.fit(data, batch_size=batch_size, epochs=3, shuffle=False, verbose=0)
        else:
            history = trainer.fit(model, data, epochs=3)
        runs.append((history.history, [w.numpy() for w in model.weights]))
    (want_history, want), (got_history, got) = runs
    assert got_history.keys() == want_history.keys()
    np.testing.assert_allclose(got_history["loss"], want_history["loss"], rtol=1e-5)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
