"""The readers that step calls consume, and which way CPU replicas read.

`ArrayFeed` (arrays on CPU replicas), `GlobalBatches` (a dataset's global batches on CPU replicas) and
`DistributedBatches` (TensorFlow's distributed iterator), made by `inputs.Readers`; each runs the loops of
`fused.Loops` that fit it, so the steps never ask what they were handed. A reader keeps the host side of
reading, which steps come next and from what: it never cuts a global batch into the replicas' shares itself,
which is `trainer/data/feed.py`'s. Why each form is read this way: docs/performance.md, "Defaults and why".
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np
import tensorflow as tf

from trainer.data import marks
from trainer.data.arrays import OrderFn, computed_slices, fed_dtype, take, uniform_rows
from trainer.data.specs import has_composite
from trainer.distribute import strategy as strategy_lib
from trainer.distribute.cluster import is_parameter_server


ACCELERATOR_READER = "TRAINER_ACCELERATOR_READER"  # "1": CPU replicas read as accelerators do (tests)


def reads_in_step(strategy: tf.distribute.Strategy) -> bool:
    """Whether the replicas read in the step (`ArrayFeed`, `GlobalBatches`): when they are CPUs.

    On GPUs and TPUs the tf.data pipeline stays: it prefetches batches to the
    devices while they compute (and TPU replicas cannot run Python). Under
    parameter-server training, steps run on remote workers that hold no arrays.
    With TRAINER_ACCELERATOR_READER=1 in the environment, CPU replicas read as
    accelerators do, so that what GPUs run is what CPU-only tests run.
    """
    if os.environ.get(ACCELERATOR_READER) == "1":
        return False
    return not (is_parameter_server(strategy) or strategy_lib.runs_on_accelerators(strategy))


FETCH_BYTES = 8 * 2**20  # rows gathered per step call, at most (unless one step needs more)


class ArrayFeed:
    """Serves global steps of `epochs` over in-memory arrays, a call's worth at a time.

    Args:
      arrays: the arrays (a nested structure, one row per example).
      order: epoch -> the global order of the examples in that epoch.
      global_batch_size: examples per global step.
      num_replicas: replicas in sync (over all workers).
      epochs: the epochs this feed covers, in order.
      start_step: global steps to skip in the first epoch (a resumed run).
    """

    def __init__(self, arrays: Any, order: OrderFn, *, global_batch_size: int, num_replicas: int,
                 epochs: range = range(1), start_step: int = 0):
        self.leaves = [a for a in tf.nest.flatten(arrays) if a is not None]  # None: an optional input's absence
        # [steps, replicas]: where the rows each replica computes on start in the epoch order, how many,
        # and which of them it counts in the metrics.
        self._starts, self._sizes, self._tracked_begins, self._tracked_ends = computed_slices(
            len(self.leaves[0]), global_batch_size, num_replicas)
        self.steps_per_epoch = len(self._starts)
        step_bytes = global_batch_size * sum(a[:1].nbytes for a in self.leaves)
        self.steps_per_fetch = max(1, FETCH_BYTES // max(1, step_bytes))
        self._order_fn, self._epochs = order, iter(epochs)
        self._rows: np.ndarray | None = None
        self.step = start_step  # the next step of the current epoch
        # What the traced step loop depends on: structure, dtypes and per-example shapes, and the rows of a
        # replica's step when every step has the same (`step_batch`).
        self.signature = (tf.nest.map_structure(lambda a: None if a is None else 0, arrays),
                          tuple((fed_dtype(a).str, a.shape[1:]) for a in self.leaves), uniform_rows(self._sizes))

    def run(self, loops, num_steps: int) -> int:
        """Runs up to `num_steps` steps through `loops.feed`, a call per piece; returns how many ran."""
        loops.use_feed(self)
        ran = 0
        for first, count in self.fetches(num_steps):
            loops.feed(self.signature, tf.constant(first, tf.int64), tf.constant(count, tf.int64))
            ran += count
        return ran

    def predictions(self, loops) -> Iterator[Any]:
        """The outputs of `loops.feed`, one global batch after another."""
        loops.use_feed(self)
        for step, _ in iter(lambda: self.claim(1), (0, 0)):
            yield loops.feed(self.signature, tf.constant(step, tf.int64))

    def claim(self, num_steps: int) -> tuple[int, int]:
        """(first step, steps) for the next call: up to `num_steps` steps of the current epoch.

        Moves to the next epoch once the current one is done (also a first one
        resumed after its last step); (0, 0) when every epoch has been served.
        """
        while self._rows is None or self.step >= self.steps_per_epoch:
            epoch = next(self._epochs, None)
            if epoch is None:
                return 0, 0
            if self._rows is not None:
                self.step = 0
            self._rows = np.asarray(self._order_fn(epoch), np.int64)
        first = self.step
        count = max(0, min(num_steps, self.steps_per_epoch - first))
        self.step += count
        return first, count

    def fetches(self, num_steps: int) -> Iterator[tuple[int, int]]:
        """Claims up to `num_steps` steps and yields them as (first, count) pieces, one per step call.

        A piece holds at most `steps_per_fetch` steps, all with the same
        per-replica batch sizes: a step call is one `tf.while_loop`, and a
        collective whose shape changes between its iterations aborts (the
        all-gather of an Embedding's sparse gradient has a row per example).
        So the uneven last step of an epoch gets a call of its own.
        """
        first, count = self.claim(num_steps)
        end = first + count
        while first < end:
            same = np.all(self._sizes[first:end] == self._sizes[first], axis=1)
            uniform = int(np.argmin(same)) if not same.all() else end - first
            piece = min(self.steps_per_fetch, uniform)
            yield first, piece
            first += piece

    def replica_rows(self, first: int, count: int, replica: int) -> list[np.ndarray]:
        """`replica`'s rows of steps first..first+count-1 of the current epoch (NumPy).

        Returns the rows of every array, concatenated step after step; then where
        each step's rows begin and end ([count + 1] bounds); then each step's
        `Share.global_count` ([count]); then each step's tracked rows and
        `Share.placed` ([count, 4]: begin, end, first row, examples).
        """
        steps = slice(first, first + count)
        starts, sizes = self._starts[steps, replica], self._sizes[steps, replica]
        rows = np.concatenate([self._rows[s : s + n] for s, n in zip(starts, sizes)])
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        global_counts = self._sizes[steps].sum(axis=1).astype(np.float32)
        tracked = np.stack([self._tracked_begins[steps, replica], self._tracked_ends[steps, replica],
                            starts - self._starts[steps, 0],
                            (self._tracked_ends[steps] - self._tracked_begins[steps]).sum(axis=1)], axis=1)
        return [take(a, rows) for a in self.leaves] + [bounds, global_counts, tracked.astype(np.int64)]


class GlobalBatches:
    """A plain iterator of a dataset's global batches, which the replicas split (`feed.share_of`).

    A step call runs steps of one shape only (see `ArrayFeed.fetches`). A batch
    whose shapes differ from those of the call's first step ends the call unrun:
    it is `held` here, and it is the first step of the next call.

    With a `place` (a fit a callback resumes), the iterator starts there, and
    `mark` is the mark of its pass (`trainer/data/marks.py`).
    """

    def __init__(self, dataset: tf.data.Dataset, place: marks.Place | None = None):
        self.iterator, self.mark = marks.iterator_at(dataset, place)
        self.held = tf.experimental.Optional.empty(self.iterator.element_spec)
        self.composite = has_composite(dataset.element_spec)  # see `DistributedBatches`

    def mark_here(self, index: int, step: int) -> marks.Mark | None:
        """A mark of where the iterator is, as pass `index` at `step` (a stream's epoch start); None while a
        batch is held, which the iterator's state would not hold."""
        if self.held.has_value():
            return None
        return marks.mark_here(self.iterator, index, step)

    def run(self, loops, num_steps: int) -> int:
        """Runs up to `num_steps` steps through `loops.global_batches`; returns how many ran."""
        ran = 0
        while ran < num_steps:
            wanted = 1 if self.composite else num_steps - ran
            executed, self.held = loops.global_batches(self.iterator, self.held, tf.constant(wanted))
            ran += int(executed)
            if not self.held.has_value() and (not self.composite or not executed):  # the steps ran, or the data ended
                break
        return ran

    def predictions(self, loops) -> Iterator[Any]:
        """The outputs of `loops.global_batch`, one global batch after another."""
        for batch in self.iterator:
            yield loops.global_batch(batch)


class DistributedBatches:
    """TensorFlow's distributed iterator: each replica is handed a batch of its own (`feed.whole_share`).

    For replicas on accelerators (whose pipelines prefetch to the device),
    dataset functions, and datasets that set a shard policy of their own.

    `composite`: the batches hold ragged or sparse tensors, whose shapes (and
    those of the sparse gradients they give, e.g. an Embedding's) change from
    step to step and from replica to replica; a collective whose shape changes
    inside a call's loop aborts (see trainer/engine/steps.py), so each step runs in a
    call of its own.

    It reads ahead of the steps, so a stream's place is marked only at its
    pass's start.
    """

    def __init__(self, iterator: Any, *, composite: bool = False, mark: marks.Mark | None = None):
        self.iterator, self.composite = iterator, composite
        self.mark = mark  # of the iterators the distributed pipeline reads on from (`marks.read_on`)

    def run(self, loops, num_steps: int) -> int:
        """Runs up to `num_steps` steps through `loops.distributed`; returns how many ran."""
        if not self.composite:
            return int(loops.distributed(self.iterator, tf.constant(num_steps)))
        ran = 0
        while ran < num_steps and int(loops.distributed(self.iterator, tf.constant(1))):
            ran += 1
        return ran

    def predictions(self, loops) -> Iterator[Any]:
        """The outputs of `loops.replica_batch`, one global batch after another."""
        for batch in self.iterator:
            yield loops.replica_batch(batch)
