"""Where a tf.data reader can be put back exactly: the marks a fit takes while a callback resumes it.

A `Mark` is a reader's tf.data iterators' states at a known place: when a pass's reader is made, before it
reads (a shuffle's seeds, its buffer still empty), and, in a stream read in the step, at each epoch's start.
A backup holds the latest mark with the `Reading` (the pass and step) of its boundary. A resumed run makes the
reader of the same pipeline, puts the mark's states back into its fresh iterators and reads forward to the
step (`iterator_at`): the rest of the cut epoch, each example once, in the uninterrupted run's order. Putting
a state back also puts the pipeline's reshuffling seed generator where it was, so the passes after it follow
the uninterrupted run's orders too. Why this and not the state at every backup: docs/reliability.md,
"Resuming: what is and is not exact".
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterator

import tensorflow as tf

from trainer._compat import iterator_state


@dataclasses.dataclass(frozen=True)
class Mark:
    """A reader's place that its iterators' states can be put back to.

    Attributes:
      index: the pass (`Passes.index`).
      step: global steps read from the pass at the mark.
      states: the states of the reader's iterators there: one, of the pipeline this process reads.
      inits_after: iterators the input started on its dataset after the reader's (`BatchedInput.epoch_end`'s
        spare one, as Keras's epoch iterator starts): each moves a reshuffling seed generator on one pass.
      layout: (replicas, workers) for the pipelines of a dataset function, which are the layout's; None for
        the global batches, which every layout reads alike.
    """

    index: int
    step: int
    states: tuple[bytes, ...]
    inits_after: int = 0
    layout: tuple[int, int] | None = None

    @property
    def nbytes(self) -> int:
        return sum(len(state) for state in self.states)


@dataclasses.dataclass(frozen=True)
class Reading:
    """Where a fit's reader is at a step boundary: `step` global steps read from pass `index`, the pass `spent`
    (ran out, or read to its end); `mark` is the latest mark of that reader (None: nothing marked)."""

    index: int
    step: int
    spent: bool
    mark: Mark | None = None


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a new reader starts: pass `index`, `step` global steps in, put back from `mark` where the mark
    is of that pass (or of the pass before it, whose reshuffling seeds it puts back); `layout` is this run's
    (replicas, workers)."""

    index: int
    step: int
    mark: Mark | None = None
    layout: tuple[int, int] | None = None

    def usable(self) -> Mark | None:
        """The mark this place can start from: of its layout, and of its pass (at or before its step) or of the
        pass before."""
        mark = self.mark
        if mark is None or (mark.layout is not None and mark.layout != self.layout):
            return None
        if (mark.index == self.index and mark.step <= self.step) or mark.index == self.index - 1:
            return mark
        return None


def iterator_at(dataset: tf.data.Dataset, place: Place | None, *, per_step: int = 1,
                layout: tuple[int, int] | None = None) -> tuple[Iterator[Any], Mark | None]:
    """An iterator of `dataset` at `place`, and the mark of its pass; without a place, a plain iterator.

    Where the place's mark is of the same pass, its state goes into the fresh
    iterator, which then reads forward from the mark's step; where it is of the pass before, it goes into an
    iterator made to be dropped, which puts the seed generator where it was, and the new pass starts after
    the input's later iterators (`Mark.inits_after`). Elsewhere the iterator starts from the pass's start.
    A global step is `per_step` elements (a dataset function's pipeline gives one per local replica); a mark
    of a dataset function's pipelines holds their `layout`.
    """
    if place is None:
        return iter(dataset), None
    mark = place.usable()
    if mark is not None and mark.index == place.index:
        iterator = iter(dataset)
        _put_back(iterator, mark.states[0])
        _read_past(iterator, (place.step - mark.step) * per_step)
        return iterator, mark
    if mark is not None:  # of the pass before: its seeds, then the iterators started after it
        _put_back(iter(dataset), mark.states[0])
        for _ in range(mark.inits_after):
            iter(dataset)
    iterator = iter(dataset)
    state = iterator_state.save(iterator)
    _read_past(iterator, place.step * per_step)
    return iterator, Mark(place.index, 0, (state,), layout=layout)


def mark_here(iterator: Iterator[Any], index: int, step: int) -> Mark:
    """A mark of `iterator` where it is now: pass `index`, `step` global steps read from it."""
    return Mark(index, step, (iterator_state.save(iterator),))


def _put_back(iterator: Iterator[Any], state: bytes) -> None:
    try:
        iterator_state.restore(iterator, state)
    except tf.errors.OpError as err:
        raise ValueError(
            f"The backup holds the place of a tf.data pipeline other than this run's ({err.message.splitlines()[0]}), "
            "so its epoch can't resume where it stopped. Resume with the pipeline the backup was written with, "
            "or delete the backup directory to train from the start.") from None


def _read_past(iterator: Iterator[Any], elements: int) -> None:
    """Reads `elements` elements of `iterator` and drops them: the steps the resumed run does not train again."""
    for _ in range(elements):
        iterator.get_next()


def read_on(iterator: Iterator[Any]) -> tf.data.Dataset:
    """A dataset of what `iterator` yields from where it is: what a distributed pipeline reads a marked
    iterator through, so that the pipeline's read-ahead leaves the mark as it was taken."""

    @tf.autograph.experimental.do_not_convert
    def next_element(_):
        return iterator.get_next_as_optional()

    @tf.autograph.experimental.do_not_convert
    def has_value(optional):
        return optional.has_value()

    @tf.autograph.experimental.do_not_convert
    def value(optional):
        return optional.get_value()

    return tf.data.Dataset.from_tensors(0).repeat().map(next_element).take_while(has_value).map(value)
