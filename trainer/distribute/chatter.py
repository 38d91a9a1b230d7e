"""What a Trainer's call keeps off the screen while it runs: TensorFlow's INFO lines (one per cross-device
reduce), and on every task but the chief, Keras's warnings (the chief shows them once, as model.fit would).
Everything is restored when the call returns."""

from __future__ import annotations

import functools
import logging
import warnings

import tensorflow as tf

from trainer.distribute.cluster import cluster_info


def quiet_tf_info(method):
    """`method`, run with TensorFlow's INFO lines hidden and, off the chief, Keras's warnings (they are about the
    model and the data, the same on every task)."""

    @functools.wraps(method)
    def wrapper(*args, **kwargs):
        logger = tf.get_logger()
        level = logger.level
        if logger.getEffectiveLevel() < logging.WARNING:
            logger.setLevel(logging.WARNING)
        try:
            if cluster_info().is_chief:
                return method(*args, **kwargs)  # the user's filters as they are (a change would reset their "once")
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", module=r"keras(\.|$)")
                return method(*args, **kwargs)
        finally:
            logger.setLevel(level)

    return wrapper
