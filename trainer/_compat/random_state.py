"""The global random state Keras draws from, and Keras's random functions that the draws replace.
"""

from __future__ import annotations

import contextlib
import random
from typing import Any

import numpy as np
import tensorflow as tf

# Global random state -----------------------------------------------------------
#
# Keras draws initializer and dropout seeds from Python's `random`
# (`make_default_seed`), and `keras.random` calls without a seed from a global
# SeedGenerator kept in `global_state` with the seed `set_random_seed` stored
# (keras/src/random/seed_generator.py, keras/src/utils/rng_utils.py; 3.0-3.16).
# TensorFlow's global seed is left alone: Keras's TF backend draws stateless
# random numbers from those seeds, and `tf.random.set_seed` clears the kernels
# of the user's random ops, which no restore can undo.

try:
    from keras.src.backend.common import global_state as _global_state
except ImportError:  # pragma: no cover
    _global_state = None
_KERAS_RANDOM_ATTRIBUTES = ("global_random_seed", "global_seed_generator")


@contextlib.contextmanager
def global_random_state_kept():
    """Python's, NumPy's and Keras's global random generators, as they were before the block, after it."""
    python, numpy_state = random.getstate(), np.random.get_state()
    keras_state = ({} if _global_state is None else
                   {name: _global_state.get_global_attribute(name) for name in _KERAS_RANDOM_ATTRIBUTES})
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy_state)
        for name, value in keras_state.items():
            _global_state.set_global_attribute(name, value)


@contextlib.contextmanager
def seeded(seed: int | None):
    """Inside: the global generators seeded as `keras.utils.set_random_seed(seed)` seeds them (TensorFlow's
    aside); after: as they were. `seed=None` seeds nothing."""
    if seed is None:
        yield
        return
    with global_random_state_kept():
        random.seed(seed)
        np.random.seed(seed)
        if _global_state is not None:
            _global_state.set_global_attribute("global_random_seed", seed)
            _global_state.set_global_attribute("global_seed_generator", None)  # made again from the seeds above
        yield


# Keras's random draws ----------------------------------------------------------
#
# Every random number of a Keras layer or train step comes from the TensorFlow
# backend's functions `normal`, `uniform`, `randint`, `truncated_normal` and
# `dropout` (keras/src/backend/tensorflow/random.py, 3.8-3.16), looked up on
# that module at each call (`keras.random.*`, and preprocessing layers through
# `self.backend.random`). Each turns its seed (a SeedGenerator, an int or None)
# into a stateless seed with `_cast_seed(draw_seed(seed))`, then calls
# TensorFlow's stateless op. `trainer.engine.draws` replaces the five while a step is
# traced, and turns seeds the same way (`keras_seed`).

try:
    from keras.src.backend.tensorflow import random as _tf_random
    from keras.src.random.seed_generator import draw_seed as _draw_seed
except ImportError:  # pragma: no cover
    _tf_random = _draw_seed = None
RANDOM_FUNCTIONS = ("normal", "uniform", "randint", "truncated_normal", "dropout")


def keras_random_module() -> Any:
    """The module whose functions draw Keras's random numbers on TensorFlow (with `_cast_seed`, which
    `keras_seed` reads), or None if it could not be imported."""
    return _tf_random


def keras_seed(seed: Any) -> tf.Tensor:
    """The stateless seed (int32[2]) Keras's TensorFlow backend draws with for `seed`, advancing a SeedGenerator
    as its draw would."""
    return _tf_random._cast_seed(_draw_seed(seed))


def noise_shape(inputs: Any, shape: Any) -> Any:
    """Keras's concrete shape of a dropout mask for `inputs` (its `noise_shape`, or the inputs' own)."""
    return _tf_random._get_concrete_noise_shape(inputs, shape)
