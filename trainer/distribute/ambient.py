"""The strategies a call finds around it, and which of them it runs on: the user's `with strategy.scope():`,
the strategy that distributed its data, the one its model was made in (`Strategies.for_call` decides)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from trainer import _compat


def ambient_strategy() -> tf.distribute.Strategy | None:
    """The strategy whose `with strategy.scope():` the caller is in, or None outside any."""
    if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
        return tf.distribute.get_strategy()
    return None


def data_strategy(arguments: dict[str, Any]) -> tf.distribute.Strategy | None:
    """The strategy that distributed a call's data (`x` or `validation_data`, a tf.distribute.DistributedDataset),
    or None. Two of them on different strategies are refused: a call runs on one."""
    carried = [_compat.distributed_source(arguments[name]).strategy for name in ("x", "validation_data")
               if _compat.is_distributed_dataset(arguments.get(name))]
    if len(carried) == 2 and carried[0] is not carried[1]:
        raise ValueError(
            "`x` and `validation_data` must be distributed with the same strategy: a call runs on one. Received: "
            f"{type(carried[0]).__name__} and {type(carried[1]).__name__}, two strategy objects. Distribute both "
            "with one strategy, or pass them undistributed."
        )
    return carried[0] if carried else None


def model_home(model: Any) -> tf.distribute.Strategy | None:
    """The strategy in whose scope a Keras model was made, which its own `fit` runs on (Keras's
    `distribute_strategy`); None for one made outside any scope, or anything but a model."""
    home = getattr(model, "distribute_strategy", None)
    if not isinstance(home, tf.distribute.Strategy) or home is tf.distribute.get_strategy():
        return None
    return home


def takes(setting: Any, strategy: tf.distribute.Strategy) -> bool:
    """Whether a Trainer's strategy setting runs on `strategy` as it is, rather than on one of its own: "auto"
    takes any, and "multi_worker" takes a MultiWorkerMirroredStrategy (TensorFlow runs one per process)."""
    return setting == "auto" or (setting == "multi_worker"
                                 and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy))


def same_layout(a: tf.distribute.Strategy, b: tf.distribute.Strategy) -> bool:
    """Whether two strategies are of one kind over the same devices (either may stand for the other)."""
    return type(a) is type(b) and tuple(a.extended.worker_devices) == tuple(b.extended.worker_devices)
