"""The ways to train the example's CNN that bench/throughput.py compares.

Each factory takes (strategy, x, y) and returns a runner whose `epoch()` trains
one epoch and returns the number of examples it trained on.
"""

from __future__ import annotations

import time

import keras
import numpy as np
import tensorflow as tf

from fashion_mnist import build_model

PER_REPLICA = 64
FUSED_STEPS = 32  # steps per call for the hand-tuned Keras fit and the bare step


class _Runner:
    """`epoch()` trains one epoch; `teardown_seconds`, where measured, is how long its last
    epoch waited for its tf.data iterator to be destroyed."""

    step_seconds = None
    teardown_seconds = None

    def __init__(self, epoch):
        self.epoch = epoch


class _TrainerRunner:
    """Trainer.fit(epochs=1) per epoch; `step_seconds` is the last fit's time inside step calls."""

    def __init__(self, strategy, x, y, **options):
        from trainer import Trainer

        self.trainer = Trainer(strategy=strategy, per_replica_batch_size=PER_REPLICA, **options)
        self.model, self.data, self.step_seconds, self.history = build_model(), (x, y), None, None
        self.examples = len(x)
        self._probe = _StepTime()

    def epoch(self) -> int:
        self.history = self.trainer.fit(self.model, self.data, epochs=1, callbacks=[self._probe])
        self.step_seconds = self._probe.context.step_seconds
        return self.examples


class _StepTime(keras.callbacks.Callback):
    """Keeps the TrainContext, to read how long the step calls took."""

    context = None

    def set_trainer_context(self, context) -> None:
        self.context = context


def trainer(strategy, x, y, **options) -> _TrainerRunner:
    return _TrainerRunner(strategy, x, y, **options)


def _as_dataset(x, y) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x))


def trainer_dataset(strategy, x, y) -> _TrainerRunner:
    """Trainer.fit with its defaults, fed the same examples as a tf.data dataset instead of arrays."""
    runner = _TrainerRunner(strategy, x, y)
    runner.data = _as_dataset(x, y)
    return runner


class _EpochClock(_StepTime):
    """Per epoch: wall time from one epoch end to the next, and the step calls' share of it."""

    def on_train_begin(self, logs=None):
        self.marks = [(time.perf_counter(), 0.0)]

    def on_epoch_end(self, epoch, logs=None):
        self.marks.append((time.perf_counter(), self.context.step_seconds))


def epoch_overhead(strategy, x, y, epochs: int, dataset: bool = False) -> list[float]:
    """Share of each epoch (after the first) spent outside step calls, in one multi-epoch fit.

    With `dataset`, the examples come as trainer_dataset's tf.data dataset,
    whose iterator is made again each epoch.
    """
    from trainer import Trainer

    clock = _EpochClock()
    data = _as_dataset(x, y) if dataset else (x, y)
    Trainer(strategy=strategy, per_replica_batch_size=PER_REPLICA).fit(build_model(), data, epochs=epochs,
                                                                        callbacks=[clock])
    spans = list(zip(clock.marks, clock.marks[1:]))[1:]
    return [1 - (s1 - s0) / (t1 - t0) for (t0, s0), (t1, s1) in spans]


def _keras_fit(strategy, x, y, **compile_options) -> _Runner:
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=model.loss, metrics=["accuracy"],
                      **compile_options)
    batch = PER_REPLICA * strategy.num_replicas_in_sync
    train_end = _TrainEnd()

    def epoch() -> int:
        model.fit(x, y, batch_size=batch, epochs=1, callbacks=[train_end])  # Keras's default verbosity
        # fit destroys its epoch iterator after on_train_end, just before it returns.
        runner.teardown_seconds = time.perf_counter() - train_end.at
        return len(x)

    runner = _Runner(epoch)
    return runner


class _TrainEnd(keras.callbacks.Callback):
    at = None

    def on_train_end(self, logs=None):
        self.at = time.perf_counter()


def keras_default(strategy, x, y) -> _Runner:
    return _keras_fit(strategy, x, y)  # jit_compile="auto", steps_per_execution=1


def keras_tuned(strategy, x, y) -> _Runner:
    return _keras_fit(strategy, x, y, jit_compile=False, steps_per_execution=FUSED_STEPS)


def _loss_object():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _bare_train_step(strategy, global_batch: int):
    """A replica function (images, labels) -> None: forward, backward, apply; nothing else."""
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    loss_object = _loss_object()

    def train_on(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = tf.nn.compute_average_loss(loss_object(labels, logits), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    return train_on


def bare_step(strategy, x, y) -> _Runner:
    """The floor: each replica's batches already on its device, FUSED_STEPS steps per call."""
    replicas = strategy.num_replicas_in_sync
    global_batch = PER_REPLICA * replicas
    steps = len(x) // global_batch
    train_on = _bare_train_step(strategy, global_batch)

    def replica_batches(ctx):
        # Step-major global batches, cut into contiguous per-replica slices.
        def stacked(a):
            a = a[: steps * global_batch].reshape(steps, replicas, PER_REPLICA, *a.shape[1:])
            return tf.constant(np.ascontiguousarray(a[:, ctx.replica_id_in_sync_group]))

        return stacked(x), stacked(y)

    xs, ys = strategy.experimental_distribute_values_from_function(replica_batches)

    def replica_step(xs, ys, i):
        train_on(xs[i], ys[i])

    @tf.function
    def run(xs, ys, first, count):
        for i in tf.range(first, first + count):
            strategy.run(replica_step, args=(xs, ys, i))

    def call(first: int, count: int) -> None:
        run(xs, ys, tf.constant(first), tf.constant(count))

    def epoch() -> int:
        for first in range(0, steps, FUSED_STEPS):
            call(first, min(FUSED_STEPS, steps - first))
        return steps * global_batch

    runner = _Runner(epoch)
    runner.call, runner.steps = call, steps  # for bench/step_cost.py: steps first..first+count-1 of the epoch
    return runner


def bare_step_pipeline(strategy, x, y) -> _Runner:
    """The bare step fed by the Trainer's own input path for arrays instead of batches already in memory.

    Trainer / this isolates what the Trainer adds beyond its input (metrics,
    callbacks, set-up); this / bare_step is the input's own cost.
    """
    from trainer.data import boundary
    from trainer.data import feed as feed_lib
    from trainer.data import readers as readers_lib

    global_batch = PER_REPLICA * strategy.num_replicas_in_sync
    train_on = _bare_train_step(strategy, global_batch)
    inp = boundary.as_input((x, y), arg="data")
    current = {}

    def replica_step(fetched, i, signature):
        (images, labels), _ = feed_lib.step_batch(fetched, i, signature)
        train_on(images, labels)

    @tf.function
    def run(signature, first, count):
        fetched = strategy.run(lambda: feed_lib.fetch(lambda: current["feed"], first, count, signature))
        for i in tf.range(count):
            strategy.run(replica_step, args=(fetched, i, signature))

    def epoch() -> int:
        feed = current["feed"] = readers_lib.ArrayFeed(inp.arrays, lambda _: np.random.permutation(len(x)),
                                                    global_batch_size=global_batch,
                                                    num_replicas=strategy.num_replicas_in_sync)
        while True:
            pieces = list(feed.fetches(FUSED_STEPS))
            if not pieces:
                return len(x)
            for first, count in pieces:
                run(feed.signature, tf.constant(first, tf.int64), tf.constant(count, tf.int64))

    return _Runner(epoch)


def tutorial(strategy, x, y) -> _Runner:
    """The distributed custom-training guide's loop, as written there (Keras 3 spellings)."""
    global_batch = PER_REPLICA * strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).batch(global_batch)
    dist_dataset = strategy.experimental_distribute_dataset(dataset)
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)  # Keras 3 creates slots lazily otherwise
        train_accuracy = keras.metrics.SparseCategoricalAccuracy()
    loss_object = _loss_object()

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = tf.nn.compute_average_loss(loss_object(labels, predictions), global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        train_accuracy.update_state(labels, predictions)
        return loss

    @tf.function
    def distributed_train_step(inputs):
        per_replica_losses = strategy.run(train_step, args=(inputs,))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

    def epoch() -> int:
        total_loss, num_batches = 0.0, 0
        iterator = iter(dist_dataset)  # the guide's `for batch in dist_dataset`, with its iterator named
        for batch in iterator:
            total_loss += distributed_train_step(batch)
            num_batches += 1
        float(total_loss / num_batches)
        train_accuracy.reset_state()
        start = time.perf_counter()
        del iterator
        runner.teardown_seconds = time.perf_counter() - start
        return len(x)

    runner = _Runner(epoch)
    return runner


VARIANTS = {
    "trainer": trainer,
    "trainer_dataset": trainer_dataset,
    "keras_default": keras_default,
    "keras_tuned": keras_tuned,
    "bare_step": bare_step,
    "bare_step_pipeline": bare_step_pipeline,
    "tutorial": tutorial,
}
