"""MirroredStrategy's collective group keys, and MultiWorkerMirroredStrategy's devices on a CPU worker.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

try:  # tensorflow/python/distribute/cross_device_utils.py (2.4-2.21)
    from tensorflow.python.distribute import cross_device_utils as _cross_device_utils
except ImportError:  # pragma: no cover - then strategies keep TensorFlow's numbering
    _cross_device_utils = None

@contextlib.contextmanager
def collective_key_base(base: int):
    """MirroredStrategies made inside number their collective group keys from `base`.

    `MirroredStrategy._collective_key_base`, the class attribute TensorFlow's own
    tests set (2.4-2.21); a TensorFlow without it builds strategies as usual.
    """
    cls = tf.distribute.MirroredStrategy
    previous = getattr(cls, "_collective_key_base", 0)
    cls._collective_key_base = base
    try:
        yield
    finally:
        cls._collective_key_base = previous


def collective_group_keys(strategy: tf.distribute.Strategy) -> dict[int, str]:
    """Group key -> the devices it reduces over, for the keys a MirroredStrategy's collectives took so far.

    `extended._cross_device_ops` and `extended._collective_keys._known_groups`
    (2.4-2.21); empty where they are missing, or where the strategy reduces
    without collectives (ReductionToOneDevice).
    """
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return {}
    extended = strategy.extended
    if type(getattr(extended, "_cross_device_ops", None)).__name__ != "CollectiveAllReduce":
        return {}
    known = getattr(getattr(extended, "_collective_keys", None), "_known_groups", None) or {}
    return {key: devices for devices, key in known.items()}


def collectives_serve_a_cluster() -> bool:
    """Whether this process already joined a cluster's collectives: a MultiWorkerMirroredStrategy was made here.

    `context.context()._collective_ops_server_def`, which `enable_collective_ops` sets
    (tensorflow/python/eager/context.py, 2.4-2.21). TensorFlow runs one such strategy per process: a second
    re-enables the collectives, and its keys clash with the first's ("Collective instance 110 expected
    type 1 and data_type 1 but got type 1 and data_type 9").
    """
    from tensorflow.python.eager import context

    return getattr(context.context(), "_collective_ops_server_def", None) is not None


def number_instances_from(strategy: tf.distribute.Strategy, first: int) -> bool:
    """Makes a MirroredStrategy that has launched no collective yet number its collective instances from `first`;
    whether it did.

    `extended._collective_keys` is a `CollectiveKeys` whose `_instance_key_table` holds, per group key and
    device, the next instance key to hand out, from `INSTANCE_KEY_START_NUMBER` (cross_device_utils.py,
    2.4-2.21). A strategy that has handed out keys keeps its numbering: functions traced on it hold them.
    """
    if not isinstance(strategy, tf.distribute.MirroredStrategy):
        return False
    keys = getattr(strategy.extended, "_collective_keys", None)
    table = getattr(keys, "_instance_key_table", None)
    start = getattr(_cross_device_utils, "INSTANCE_KEY_START_NUMBER", None)
    if not table or start is None:
        return False
    with keys._lock:
        if any(key != start for devices in table.values() for key in devices.values()):
            return False
        for devices in table.values():
            for device in devices:
                devices[device] = first
    return True


try:  # tensorflow/python/distribute/collective_all_reduce_strategy.py (2.18-2.22)
    from tensorflow.python.distribute.collective_all_reduce_strategy import (
        CollectiveAllReduceExtended as _CollectiveExtended,
    )
except ImportError:  # pragma: no cover - then a CPU worker keeps TensorFlow's one replica
    _CollectiveExtended = None


def _own_cpu_count(worker_device: str) -> int:
    """The logical CPUs of the task `worker_device` names ("/job:worker/task:1"; "" for a process alone)."""
    here = tf.DeviceSpec.from_string(worker_device)

    def same(a, b) -> bool:  # a part a name leaves out matches any
        return a is None or b is None or a == b

    specs = [tf.DeviceSpec.from_string(d.name) for d in tf.config.list_logical_devices("CPU")]
    return sum(1 for spec in specs if same(spec.job, here.job) and same(spec.task, here.task))


@contextlib.contextmanager
def worker_cpu_replicas():
    """MultiWorkerMirroredStrategies made inside give a worker without GPUs one replica per logical CPU of its own.

    `CollectiveAllReduceExtended._initialize_local_devices(cluster_resolver, worker_device)` -> (devices, kind)
    gives a CPU worker one device, whatever logical devices its process has, where MirroredStrategy gives one
    replica per logical CPU. With it, workers that each configure N logical CPUs (several GPUs per worker,
    simulated on CPU) run N replicas each. Like TensorFlow's GPU count, N must be the same on every worker.
    Once the worker's server runs, the logical devices listed are the whole cluster's: only this task's count.
    """
    original = getattr(_CollectiveExtended, "_initialize_local_devices", None)
    if original is None:  # pragma: no cover
        yield
        return

    def local_devices(self, cluster_resolver, worker_device):
        devices, kind = original(self, cluster_resolver, worker_device)
        count = _own_cpu_count(worker_device)
        if kind != "CPU" or count < 2:
            return devices, kind
        return tuple(f"{worker_device}/device:CPU:{i}" for i in range(count)), kind

    _CollectiveExtended._initialize_local_devices = local_devices
    try:
        yield
    finally:
        _CollectiveExtended._initialize_local_devices = original


def parameter_server_tasks(strategy: tf.distribute.Strategy) -> tuple[int, int] | None:
    """(workers, ps tasks) of a ParameterServerStrategy's cluster, or None where this TensorFlow keeps them
    otherwise. Its public `cluster_resolver` is None; `ParameterServerStrategyV2Extended` counts both from the
    resolver it was given (`_num_workers`, `_num_ps`; TF 2.18-2.22), an in-process cluster's or TF_CONFIG's."""
    workers = getattr(strategy.extended, "_num_workers", None)
    ps = getattr(strategy.extended, "_num_ps", None)
    return (workers, ps) if isinstance(workers, int) and isinstance(ps, int) else None
