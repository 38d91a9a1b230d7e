"""trainer: a Keras-style trainer for TensorFlow distribution strategies.

The same script trains on one device, many GPUs or many machines, with the same
numbers: losses and metrics are aggregated exactly across replicas.

Names are imported on first use, so `trainer-launch` starts without loading
TensorFlow.
"""

import importlib

_EXPORTS = {
    "Trainer": "trainer.trainer",
    "History": "trainer.history",
    "TrainContext": "trainer.engine.loop",
    "Plan": "trainer.engine.plan",
    "BatchPlan": "trainer.scaling",
    "ScaledSchedule": "trainer.scaling",
    "STRATEGY_NAMES": "trainer.distribute.strategy",
    "resolve_strategy": "trainer.distribute.strategy",
    "ClusterInfo": "trainer.distribute.cluster",
    "cluster_info": "trainer.distribute.cluster",
    "parse_tf_config": "trainer.distribute.cluster",
    "notebook_launcher": "trainer.launch.notebook",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
