"""trainer/engine/draws.py: a replica's random draws are its rows of the draw one device makes for the global batch."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import mirrored
from trainer.engine import draws


def _per_replica_draws(strategy, draw, global_rows: int, philox: bool = True):
    """What `draw(rows)` gives each replica of `strategy` when a global batch of `global_rows` is cut in order."""
    replicas = strategy.num_replicas_in_sync
    sizes = [global_rows // replicas + (r < global_rows % replicas) for r in range(replicas)]
    firsts = np.cumsum([0] + sizes[:-1])

    @tf.function
    def step():
        def replica_fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            rows = tf.gather(tf.constant(sizes, tf.int64), r)
            batch = tf.zeros(tf.stack([rows, 1]))
            with draws.hooks(), draws.replica_rows(batch, (tf.gather(tf.constant(firsts, tf.int64), r),
                                                           tf.constant(global_rows, tf.int64))):
                return draw(tf.shape(batch)[0])
        return strategy.run(replica_fn)

    draws._COUNTER = philox
    try:
        return [t.numpy() for t in strategy.experimental_local_results(step())]
    finally:
        draws._COUNTER = True


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


class LabelNoiseGAN(keras.Model):
    """keras.io's GAN step, reduced: label noise drawn over the generated and the real rows together."""

    def __init__(self, per_example: bool):
        super().__init__()
        self.per_example = per_example
        self.discriminator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        self.seed_generator = keras.random.SeedGenerator(3)

    def call(self, x):
        return self.discriminator(x)

    def train_step(self, data):
        real = data[0] if isinstance(data, tuple) else data
        count = tf.shape(real)[0]
        labels = tf.concat([tf.ones((count, 1)), tf.zeros((count, 1))], axis=0)
        if self.per_example:  # a draw over each batch-sized part: each replica its rows of one device's
            labels += 0.05 * tf.concat([keras.random.uniform((count, 1), seed=self.seed_generator)] * 2, axis=0)
        else:  # keras.io: one draw over both parts, which no replica's rows are a slice of
            labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            logits = self.discriminator(tf.concat([real * 0.5, real], axis=0))
            loss = keras.ops.mean(keras.losses.binary_crossentropy(labels, logits, from_logits=True))
        grads = tape.gradient(loss, self.discriminator.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        return {"loss": loss}


@pytest.mark.parametrize("per_example, replicas, warned", [(False, 2, 1), (False, 1, 0), (True, 2, 0)])
def test_a_draw_over_the_data_that_is_not_the_replicas_rows_is_named_once(per_example, replicas, warned):
    from trainer import Trainer

    model = LabelNoiseGAN(per_example)
    model.compile(optimizer="sgd")
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # each text once, as a user sees it
        Trainer(strategy=mirrored(replicas), batch_size=8, verbose=0).fit(model, x, epochs=2)
    named = [w for w in caught if "A random draw in the step has 8 rows" in str(w.message)]
    assert len(named) == warned, [str(w.message) for w in caught]
    if warned:
        assert named[0].filename == __file__  # the user's line: the draw in train_step
