"""Passes cut the input into epochs as Keras's own epoch iterator does (trainer/data/passes.py)."""

import itertools
import warnings

import numpy as np
import pytest
from keras.src.trainers.epoch_iterator import EpochIterator

from trainer.data.passes import Passes


def keras_epochs(num_batches: int, steps_per_epoch: int | None, steps_per_execution: int, epochs: int):
    """The batches each epoch reads under Keras's EpochIterator, as (pass, first batch, batches) per epoch."""
    x = np.arange(num_batches, dtype="int64")
    iterator = EpochIterator(x=x, batch_size=1, steps_per_epoch=steps_per_epoch,
                             steps_per_execution=steps_per_execution)
    read, passes, last = [], -1, None
    for _ in range(epochs):
        batches = []
        with warnings.catch_warnings(), iterator.catch_stop_iteration():
            warnings.simplefilter("ignore")  # "Your input ran out of data"
            for *_, data in iterator:  # (begin, end, data) from Keras 3.11, (begin, data) before
                batches += [int(b[0]) for b in data]
        if batches and (last is None or batches[0] <= last):  # a pass begins again from batch 0
            passes += 1
        last = batches[-1] if batches else last
        read.append((passes, batches[0] if batches else None, len(batches)))
    return read


def trainer_epochs(num_batches: int, steps_per_epoch: int | None, steps_per_execution: int, epochs: int):
    passes = Passes.starting_at(0, steps_per_epoch, num_batches, steps_per_execution)
    read = []
    for epoch in range(epochs):
        passes.begin_epoch(epoch)
        first, done = passes.step, 0
        while n := passes.call_steps(done, steps_per_execution):
            passes.ran(n, n)
            done += n
        read.append((passes.index, first if done else None, done))
    return read


@pytest.mark.parametrize("num_batches, steps_per_epoch, steps_per_execution",
                         list(itertools.product([1, 4, 7, 10], [None, 1, 2, 3, 4, 9, 12], [1, 2, 3])))
def test_epochs_read_what_keras_epochs_read(num_batches, steps_per_epoch, steps_per_execution):
    if steps_per_epoch is not None and steps_per_epoch > num_batches:
        steps_per_epoch = num_batches + steps_per_epoch % 3  # just beyond the data, as Keras's tests set it
    assert trainer_epochs(num_batches, steps_per_epoch, steps_per_execution, 5) == \
        keras_epochs(num_batches, steps_per_epoch, steps_per_execution, 5)


def test_ten_batches_in_epochs_of_nine_run_nine_then_one():
    assert [n for _, _, n in trainer_epochs(10, 9, 1, 4)] == [9, 1, 9, 1]
    assert [n for _, _, n in trainer_epochs(10, 3, 2, 3)] == [4, 4, 2]  # calls of 2 from steps 0 and 2


@pytest.mark.parametrize("steps_per_epoch, steps_per_execution", [(3, 1), (4, 1), (9, 1), (3, 2)])
def test_a_resumed_run_reads_where_the_uninterrupted_run_would(steps_per_epoch, steps_per_execution):
    uninterrupted, starts = Passes.starting_at(0, steps_per_epoch, 10, steps_per_execution), []
    for epoch in range(6):
        uninterrupted.begin_epoch(epoch)
        starts.append((uninterrupted.index, uninterrupted.step))
        done = 0
        while n := uninterrupted.call_steps(done, steps_per_execution):
            uninterrupted.ran(n, n)
            done += n
    for epoch, step in [(0, 1), (1, 0), (2, 1), (3, 2), (5, 0)]:
        resumed = Passes.starting_at(0, steps_per_epoch, 10, steps_per_execution)
        assert resumed.begin_epoch(epoch, step) or (epoch, step) == (0, 0)  # the reader must be placed
        index, first = starts[epoch]
        assert (resumed.index, resumed.step) == (index, first + step)


def test_an_unknown_pass_ends_where_its_reader_runs_dry():
    passes = Passes.starting_at(0, 6, None)
    passes.begin_epoch(0)
    assert passes.call_steps(0, 8) == 6  # the epoch's steps, whatever the data holds
    passes.ran(4, 6)  # the data ran out after 4
    assert passes.spent and passes.cut_short(4) and passes.call_steps(4, 8) == 0
    assert passes.begin_epoch(1) and (passes.index, passes.step) == (1, 0)


@pytest.mark.parametrize("steps_per_epoch", [None, 10])
def test_a_run_resumed_after_the_passs_last_step_reads_the_next_pass_in_the_next_epoch(steps_per_epoch):
    """A backup taken at the last step of a pass (killed before the epoch's end was saved) resumes there: the
    epoch runs no step, and the next epoch reads the next pass from its start."""
    resumed = Passes.starting_at(0, steps_per_epoch, 10)
    assert resumed.begin_epoch(1, 10)
    assert resumed.call_steps(10, 4) == 0 and not resumed.cut_short(10)  # nothing left, and no "ran out"
    resumed.begin_epoch(2)
    assert (resumed.index, resumed.step) == (2, 0) and resumed.call_steps(0, 4) == 4
