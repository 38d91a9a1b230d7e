"""Several steps in one `tf.function` call: a `tf.while_loop` over the batches a reader of trainer/data
hands over, which stops early when the data ends and never reads a batch it will not run.

A call's steps all have the same shapes: TensorFlow keys a collective once per
graph, so one whose shape changes between iterations aborts the job ("Shape
mismatch in the collective instance"). The all-gather of an Embedding's sparse
gradient has a row per example, so the uneven last step runs in a call of its own.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import tensorflow as tf

from trainer.data import feed as feed_lib

# `run(replica_fn, *args)`: one step on every replica, in cross-replica context (`Steps._run`).
Run = Callable[..., None]


@dataclasses.dataclass(frozen=True)
class Loops:
    """A phase's (train or evaluate) compiled step loops, one for each reader of trainer/data.

    Attributes:
      use_feed: (ArrayFeed) -> None: the feed that `feed` reads when it runs.
      feed: (ArrayFeed.signature, first step, steps) -> runs those steps of the feed's epoch.
      global_batches: (iterator, held, steps) -> (steps run, batch held back), on whole global batches.
      distributed: (distributed iterator, steps) -> steps run.
    """

    use_feed: Callable
    feed: Callable
    global_batches: Callable
    distributed: Callable


@dataclasses.dataclass(frozen=True)
class PredictLoops:
    """Compiled predict steps, one for each reader; each returns a global batch's outputs.

    Attributes:
      use_feed: as in `Loops`.
      feed: (ArrayFeed.signature, step) -> the outputs of that step of the feed's epoch.
      global_batch: a whole global batch -> its outputs.
      replica_batch: a distributed iterator's per-replica batches -> their outputs, gathered.
    """

    use_feed: Callable
    feed: Callable
    global_batch: Callable
    replica_batch: Callable


def on_replica_batches(run: Run, replica_fn, iterator, num_steps, after_step: Callable | None = None):
    """Up to `num_steps` steps on what a distributed iterator hands each replica; returns how many ran.
    `after_step` runs after each step (the learning rate's warmup)."""
    def on_replica_batch(batch):
        return replica_fn(feed_lib.handed_share(batch))

    def step(executed, optional):
        run(on_replica_batch, optional.get_value())
        if after_step is not None:
            after_step()
        return executed + 1, tf.constant(False)

    def body(executed, ended):
        del ended
        optional = iterator.get_next_as_optional()  # read only when a step is due: no batch is lost
        return tf.cond(optional.has_value(), lambda: step(executed, optional),
                       lambda: (executed, tf.constant(True)))

    executed, _ = tf.while_loop(lambda executed, ended: tf.logical_and(executed < num_steps, tf.logical_not(ended)),
                                body, (tf.constant(0), tf.constant(False)))
    return executed


def on_global_batches(run: Run, replica_fn, iterator, held, num_steps, after_step: Callable | None = None):
    """Up to `num_steps` steps on whole global batches, starting with `held` (if any), each split over the
    replicas; a batch whose shapes differ from the first step's ends the call and is returned unrun.
    Returns (steps run, the batch held back)."""
    def on_global_batch(batch):
        return replica_fn(feed_lib.share_of(batch))

    none = tf.experimental.Optional.empty(iterator.element_spec)
    first_shape = tf.zeros([feed_lib.shape_key_length(iterator.element_spec)], tf.int32)

    def step(executed, batch, shape):
        run(on_global_batch, batch)
        if after_step is not None:
            after_step()
        return executed + 1, shape, tf.constant(False), none

    def on_batch(executed, shape, optional):
        batch = optional.get_value()
        batch_shape = feed_lib.shape_key(batch)
        same = tf.logical_or(tf.equal(executed, 0), tf.reduce_all(tf.equal(batch_shape, shape)))
        return tf.cond(same, lambda: step(executed, batch, batch_shape),
                       lambda: (executed, shape, tf.constant(True), optional))

    def body(executed, shape, stop, kept):
        del stop, kept
        resume = tf.logical_and(tf.equal(executed, 0), held.has_value())
        optional = tf.cond(resume, lambda: held, iterator.get_next_as_optional)  # read only when a step is due
        return tf.cond(optional.has_value(), lambda: on_batch(executed, shape, optional),
                       lambda: (executed, shape, tf.constant(True), none))

    executed, _, _, kept = tf.while_loop(
        lambda executed, shape, stop, kept: tf.logical_and(executed < num_steps, tf.logical_not(stop)),
        body, (tf.constant(0), first_shape, tf.constant(False), none))
    return executed, kept


def on_feed(run: Run, replica_fn, fetched, signature, count, after_step: Callable | None = None) -> None:
    """`count` steps of an array feed's epoch, from each replica's rows `fetched` for them (`feed.fetch`)."""
    def step_fn(fetched, i):
        return replica_fn(feed_lib.step_batch(fetched, i, signature))

    def body(i):
        run(step_fn, fetched, i)
        if after_step is not None:
            after_step()
        return i + 1

    tf.while_loop(lambda i: i < count, body, (tf.constant(0, tf.int64),))


class RaggedParts(NamedTuple):
    """A `tf.RaggedTensor` output as the dense parts that replicas' outputs are gathered by (`strategy.gather`
    concatenates each part in replica order, which concatenates the ragged rows)."""

    flat_values: tf.Tensor
    nested_row_lengths: tuple

    @classmethod
    def of(cls, value: Any) -> Any:
        return cls(value.flat_values, value.nested_row_lengths()) if isinstance(value, tf.RaggedTensor) else value

    @classmethod
    def joined(cls, value: Any) -> Any:
        """`value` with its RaggedParts made ragged again."""
        if isinstance(value, cls):
            return tf.RaggedTensor.from_nested_row_lengths(value.flat_values, value.nested_row_lengths,
                                                           validate=False)
        if isinstance(value, dict):
            return {key: cls.joined(v) for key, v in value.items()}
        if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
            return type(value)(cls.joined(v) for v in value)
        return value
