"""trainer: a Keras-style trainer for TensorFlow distribution strategies.

The same script trains on one device, many GPUs or many machines, with the same
numbers: losses and metrics are aggregated exactly across replicas.
"""

from trainer.plan import Plan
from trainer.scaling import BatchPlan, ScaledSchedule
from trainer.strategy import STRATEGY_NAMES, ClusterInfo, cluster_info, parse_tf_config, resolve_strategy
from trainer.trainer import Trainer

__all__ = [
    "BatchPlan",
    "ClusterInfo",
    "Plan",
    "STRATEGY_NAMES",
    "ScaledSchedule",
    "Trainer",
    "cluster_info",
    "parse_tf_config",
    "resolve_strategy",
]
__version__ = "0.1.0"
