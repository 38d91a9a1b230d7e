"""Evaluation and prediction: one pass over the data, with the test and predict hooks called as
`model.evaluate` and `model.predict` call them; and the helper thread that destroys spent iterators."""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Callable, Iterator

import numpy as np
import tensorflow as tf

from trainer import _compat
from trainer.engine.callback_hooks import TEST_BATCH_HOOKS, keras_steps_per_call, overrides_batch_hooks
from trainer.engine.steps import Steps

EVAL_STEPS_PER_EXECUTION = 32
MakeReader = Callable[..., Any]  # (input, epoch=None, start_step=0, until=None) -> a reader (`inputs.Readers`)


def release(held: list) -> None:
    """Empties `held` on a helper thread, so that the iterators in it are destroyed there.

    Destroying a tf.data iterator can block for seconds (MirroredStrategy
    iterators, even after their data ran out): it waits for tf.data's
    autotuner, whose sleeps double from 10 ms (docs/performance.md). With `autotune.enabled = False` it does not
    wait, but that would also stop tuning the user's pipeline. Training need
    not wait for it.
    """
    if held:
        items = held[:]
        held.clear()
        threading.Thread(target=items.clear, name="trainer-release-iterator").start()


@contextlib.contextmanager
def one_pass(make_reader: MakeReader, inp, *, read_all: bool):
    """A reader of one pass over `inp` (evaluate, predict), with the input's epoch begun and ended around it.

    `read_all`: whether the pass will read all of `inp` (no step limit).
    """
    inp.epoch_begin()
    held = [make_reader(inp)]  # see `release`
    try:
        yield held[0]
    finally:
        release(held + inp.epoch_end(read_all=read_all))


def run_eval(steps: Steps, make_reader: MakeReader, inp, callbacks, num_steps: int | None = None,
             known_steps: int | None = None) -> dict[str, float]:
    """Evaluates over all of `inp` (or `num_steps` steps of it); exact results.

    Calls the test hooks as `model.evaluate` does. A callback with a test-batch
    hook sees each call of the model's compiled `steps_per_execution` (every
    batch, by default), named as Keras's (`_compat.batch_end_index`), with the metrics
    so far (one that sets `handles_fused_steps`, a progress bar, every call's
    last); otherwise the hooks bracket each call of `EVAL_STEPS_PER_EXECUTION`
    steps. `known_steps`, the input's steps when known, only
    spares a batch-begin hook for a batch past the end, as Keras's (reading
    goes on until the data ends).
    """
    steps.objective.reset()
    # Reading the metrics is a collective across workers, so whether to read them may not depend on a callback that
    # only the chief has (its progress bar, `reads_batch_logs = False`: it shows the pass's logs at its end).
    batch_logs = any(overrides_batch_hooks(c, TEST_BATCH_HOOKS) and getattr(c, "reads_batch_logs", True)
                     for c in callbacks.callbacks)
    per_batch = any(overrides_batch_hooks(c, TEST_BATCH_HOOKS) and not getattr(c, "handles_fused_steps", False)
                    for c in callbacks.callbacks)
    per_call = keras_steps_per_call(callbacks.model) if per_batch else EVAL_STEPS_PER_EXECUTION
    callbacks.model.stop_evaluating = False
    callbacks.on_test_begin()
    with one_pass(make_reader, inp, read_all=num_steps is None) as reader:
        done = 0
        while num_steps is None or done < num_steps:
            n = per_call if num_steps is None else min(per_call, num_steps - done)
            if known_steps is None or done < known_steps:
                callbacks.on_test_batch_begin(done)
            ran = steps.evaluate(reader, n)
            if ran:
                last = _compat.batch_end_index(done, n) if per_batch else done + ran - 1
                callbacks.on_test_batch_end(last, steps.objective.results("test_step") if batch_logs else {})
            done += ran
            if ran < n or callbacks.model.stop_evaluating:
                break
    logs = steps.objective.results("test_step")
    callbacks.on_test_end(logs)
    return logs


def run_predict(batches: Iterator[Any], callbacks, num_steps: int | None = None,
                known_steps: int | None = None) -> list[Any]:
    """The outputs of `batches`, one global batch after another (the first `num_steps`), with the predict hooks
    called as `model.predict` calls them: once per call of the model's compiled `steps_per_execution` (every
    batch, by default), named as Keras's (`_compat.batch_end_index`), the call's outputs in `on_predict_batch_end`'s
    logs. `known_steps` as in `run_eval`."""
    per_call = keras_steps_per_call(callbacks.model)
    outputs: list[Any] = []
    callbacks.model.stop_predicting = False
    callbacks.on_predict_begin()
    while num_steps is None or len(outputs) < num_steps:
        begin = len(outputs)
        n = per_call if num_steps is None else min(per_call, num_steps - begin)
        if known_steps is None or begin < known_steps:
            callbacks.on_predict_batch_begin(begin)
        call = list(itertools.islice(batches, n))
        if not call:
            break
        outputs.extend(call)
        callbacks.on_predict_batch_end(_compat.batch_end_index(begin, n), {"outputs": joined(call)})
        if len(call) < n or callbacks.model.stop_predicting:
            break
    callbacks.on_predict_end()
    return outputs


def joined(batches: list[Any]) -> Any:
    """The outputs of several batches as one, as Keras joins them: arrays concatenated, and ragged outputs as one
    `tf.RaggedTensor`."""
    if len(batches) == 1:
        return batches[0]

    def join(*parts):
        return tf.concat(parts, axis=0) if isinstance(parts[0], tf.RaggedTensor) else np.concatenate(parts, axis=0)

    return tf.nest.map_structure(join, *batches)
