"""How the trainer traces its graphs: as written, without AutoGraph, with call statistics per function; a
step function with the replica hooks installed while it traces."""

from __future__ import annotations

import functools
from typing import Any, Callable

import tensorflow as tf

from trainer import _compat
from trainer.engine import draws


def graph_function(fn: Callable, **kwargs: Any) -> Callable:
    """`tf.function(fn, **kwargs)` without AutoGraph, in `fn` and in the replica functions it runs.

    The trainer's loops and branches are explicit (`tf.while_loop`, `tf.cond`),
    as in Keras's own train functions, which are also traced without AutoGraph;
    so user code (losses, metrics, layers) runs as it does under `Model.fit`.
    A trace with `autograph=False` runs under AutoGraph's "disabled" status,
    which `strategy.run` follows: it does not convert the replica function.

    Without AutoGraph, a trace cannot depend on a conversion succeeding:
    AutoGraph can leave a loop unconverted without a warning (docs/design.md).

    Each call of `graph_function` makes a function with its own retracing
    statistics. TensorFlow counts traces per code object, so the first trace
    of every new model's step, read and reset functions, each traced once,
    added up to "5 out of the last 5 calls ... triggered tf.function
    retracing" warnings in a session that fits five models. A `partial` has
    no code object of its own, so TensorFlow counts its traces per instance,
    and still warns when one function really retraces.
    """
    wrapped = functools.partial(fn)
    wrapped.__name__ = getattr(fn, "__name__", "graph_function")  # names the traced graphs
    return tf.function(wrapped, autograph=False, **kwargs)


def step_function(fn, **kwargs):
    """`graph_function(fn)`, traced with `_compat.replica_hooks` installed (replica shares, global clipping,
    one apply) and `draws.hooks` (each replica's rows of one device's random draws)."""
    @functools.wraps(fn)
    def traced(*args):
        with _compat.replica_hooks(), draws.hooks():  # the body runs only while TensorFlow traces it
            return fn(*args)

    return graph_function(traced, **kwargs)
