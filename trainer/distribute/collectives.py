"""Distinct collective group keys for the MirroredStrategies of one process.

Every MirroredStrategy numbers its collective groups from 1. Two of them over
different devices, used in one process (a second `fit` in a notebook, say),
both launch group 1 with different sizes, and TensorFlow then aborts every
collective of the process ("is joining a group with size 4, but that group has
size 2"). Two over the same devices (keras.io's guide makes a new one for each
training run) share group 1 and number its collective instances alike, and one
whose calls launch collectives in another order than the other's aborts too
("Collective instance 100 expected type 2 and data_type 3 but got type 0").
Strategies the trainer builds get a range of keys of their own, and so does a
user's strategy the trainer runs on before it has run a collective; one passed
in whose keys clash with keys already used is refused before it runs anything.

TensorFlow has no public way to choose the keys: `_compat.collective_key_base`
sets the class attribute its own tests use, `_compat.number_instances_from`
moves a fresh strategy's instance counters, and `_compat.collective_group_keys`
reads the keys a strategy took. If a TensorFlow version lacks them, strategies
are built as usual and not checked.
"""

from __future__ import annotations

import itertools
import threading

import tensorflow as tf

from trainer import _compat

_KEYS_PER_STRATEGY = 1000  # a strategy takes one group key per device set it reduces over
_bases = itertools.count(1)
_INSTANCES_PER_STRATEGY = 1_000_000  # collective instances a strategy may trace (int32 keys: over 2,000 strategies)
_next_range = 1  # the next range of instance keys to give a strategy that has launched no collective
_lock = threading.Lock()
_used: dict[int, str] = {}  # group key -> the devices that used it, in this process


def mirrored_strategy(devices: list[str], cross_device_ops=None) -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy whose collective group keys no other strategy of this process uses."""
    with _lock, _compat.collective_key_base(_KEYS_PER_STRATEGY * next(_bases)):
        return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)


def claim_group_keys(strategy: tf.distribute.Strategy) -> None:
    """Gives `strategy` collective instance keys of its own if it has launched no collective yet; raises
    ValueError if it would reuse a group key that other devices used in this process."""
    groups = _compat.collective_group_keys(strategy)
    global _next_range
    with _lock:
        for key, devices in groups.items():
            if _used.get(key, devices) != devices:
                raise ValueError(
                    "`strategy` must not reuse the collective group keys of another MirroredStrategy of this "
                    f"process. Received: strategy=MirroredStrategy over {devices.count(',') + 1} device(s), "
                    f"group key {key}, which a strategy over {_used[key].count(',') + 1} device(s) already "
                    "used; TensorFlow would abort every collective. Build strategies with "
                    "trainer.resolve_strategy('mirrored', devices=[...]) (each gets its own keys), pass "
                    "cross_device_ops=tf.distribute.ReductionToOneDevice(), or use one device layout per process."
                )
        _used.update(groups)
        if _compat.number_instances_from(strategy, _INSTANCES_PER_STRATEGY * _next_range):
            _next_range += 1
