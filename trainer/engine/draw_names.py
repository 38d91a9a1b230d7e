"""Naming a random draw that follows the data but not the replica's rows: once, in a warning at the user's
line, and in the record of the steps that traced it (`Steps.named_draws`), for the next fit's plan."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from trainer.user_line import user_stacklevel


class Unsliced(UserWarning):
    pass


def warn_unsliced(leading: int, rows: int, where: tuple, named: dict | None) -> None:
    """Names a draw that follows the data but not the replica's rows (keras.io's GANs draw label noise over the
    generated and the real rows together): each replica draws numbers of its own, not its rows of one
    device's draw, so the step's numbers are not one device's. `where`: (file, line, module) of the draw;
    `named`: the steps' record (`replica_rows`), which gets the draw for the plan, and names each draw once
    however the user's filters show warnings."""
    if named is not None:
        if where[:2] in named:
            return
        named[where[:2]] = f"{os.path.basename(where[0])}:{where[1]} draws {leading} rows where a replica has {rows}"
    text = (
        f"A random draw in the step has {leading} rows, computed from the data, where the replica's batch has "
        f"{rows}: the trainer gives a replica its rows of one device's draw only for a draw over its own rows, so "
        f"each replica draws this one on its own, and the numbers differ from one device's. Draw per example "
        f"instead (a draw over each batch-sized part, e.g. keras.random.uniform((batch_size, 1)) for the "
        f"generated and for the real rows, then concatenated) to have one device's numbers.")
    warnings.warn_explicit(text, Unsliced, where[0], where[1], module=where[2])


def user_line() -> tuple:
    """(file, line, module) of the user's code that made the draw being traced."""
    frame = sys._getframe(user_stacklevel() - 1)  # a stacklevel counts its caller as 1
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals.get("__name__", "")


def name_unsliced_when_run(leading: tf.Tensor, rows: Any, named: dict | None, unless: Any = None) -> None:
    """`warn_unsliced` from the step, for a draw whose sizes are known only when it runs: a branch that runs
    only for such a draw (a scalar comparison a step otherwise), pointing at the line found now. `unless`: a
    bool tensor that holds where the draw is exact after all (its parts are the replica's rows); `named`: the
    steps' record."""
    where = user_line()

    def warn(leading, rows):
        warn_unsliced(int(leading), int(rows), where, named)
        return np.int32(0)

    rows = tf.cast(rows, leading.dtype)
    unsliced = tf.logical_and(leading > rows, tf.equal(leading % tf.maximum(rows, 1), 0))
    if unless is not None:
        unsliced = tf.logical_and(unsliced, tf.logical_not(unless))
    tf.cond(unsliced, lambda: tf.numpy_function(warn, [leading, rows], tf.int32, stateful=True),
            lambda: tf.constant(0, tf.int32))
