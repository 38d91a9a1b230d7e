"""Distinct collective group keys for the MirroredStrategies of one process.

Every MirroredStrategy numbers its collective groups from 1, so two in one process clash. Strategies the trainer
builds, and a user's strategy that has run no collective when the trainer first runs on it, get a range of keys
of their own; a strategy whose keys clash with keys already used is refused before it runs anything. Why:
docs/reliability.md, "Several strategies in one process".
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
                    "resolve_strategy('mirrored', devices=[...]) (`from trainer import resolve_strategy`; each gets "
                    "its own keys), pass cross_device_ops=tf.distribute.ReductionToOneDevice(), or use one device "
                    "layout per process."
                )
        _used.update(groups)
        if _compat.number_instances_from(strategy, _INSTANCES_PER_STRATEGY * _next_range):
            _next_range += 1
