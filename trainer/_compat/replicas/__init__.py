"""Keras's arithmetic in a replica of several, made one device's while the trainer traces a step.

Each module hooks one family of Keras's (and TensorFlow's) functions:

- `shares`: the replicas' shares of the loss and the gradients (Keras assumes 1/replicas each), and the
  weight of each output's logged loss;
- `optimizer`: clipping, gradient accumulation and EMA on the summed gradient;
- `batch_norm`: synchronized BatchNormalization's statistics over the global batch;
- `summed_variables`: the updates of variables summed over replicas;
- `parameter_servers`: updates of sharded variables from a cross-replica apply;
- `collective`: the sums and gathers between replicas the others use.

All of them are installed together, through the one table below (`HOOKS`), while a step traces.
"""

from __future__ import annotations

import contextlib

from ..patches import Patches
from ..sharded import _PSExtended
from .batch_norm import NN_FILE, compute_moments_sync, tf_nn
from .optimizer import BaseOptimizer, apply, clip_gradients, interim
from .parameter_servers import ps_update
from .shares import (CompileLoss, Mean, TFOptimizer, all_reduce_sum_gradients, loss_module, originals,
                     replica_share, scale, tracker_update, unscale)
from .summed_variables import KerasVariable, summed_update

_LOSS = "keras/src/losses/loss.py"
_TF_OPTIMIZER = "TFOptimizer (keras/src/backend/tensorflow/optimizer.py)"
_OPTIMIZER = "BaseOptimizer (keras/src/optimizers/base_optimizer.py)"
_VARIABLE = "Variable (keras/src/backend/common/variables.py)"
HOOKS = (  # (key, owner, attribute, replacement, where)
    ("scale", loss_module, "scale_loss_for_distribution", scale, _LOSS),
    ("unscale", loss_module, "unscale_loss_for_distribution", unscale, _LOSS),
    ("tracker_update", Mean, "update_state", tracker_update, "Mean (keras/src/metrics/reduction_metrics.py)"),
    ("output_losses", CompileLoss, "metrics", None, "CompileLoss (keras/src/trainers/compile_utils.py)"),
    ("gradients", TFOptimizer, "_all_reduce_sum_gradients", all_reduce_sum_gradients, _TF_OPTIMIZER),
    ("clip", BaseOptimizer, "_clip_gradients", clip_gradients, _OPTIMIZER),
    ("apply", BaseOptimizer, "apply", apply, _OPTIMIZER),
    # replaced only inside `optimizer.apply`'s cross-replica call
    ("merge_call", interim, "maybe_merge_call", None, "tensorflow/python/distribute/merge_call_interim.py"),
    ("moments_sync", tf_nn, "_compute_moments_sync", compute_moments_sync, NN_FILE),
    ("assign_add", KerasVariable, "assign_add", summed_update("assign_add"), _VARIABLE),
    ("assign_sub", KerasVariable, "assign_sub", summed_update("assign_sub"), _VARIABLE),
    ("ps_update", _PSExtended, "_update", ps_update,
     "ParameterServerStrategyExtended (tensorflow/python/distribute/parameter_server_strategy.py)"),
)
_PATCHES = Patches("the replicas' loss and gradient shares, each output's loss weight, clipping, accumulation, "
                   "synchronized statistics and summed variables", HOOKS, originals)

__all__ = ["replica_hooks", "replica_share"]


@contextlib.contextmanager
def replica_hooks():
    """While tracing step functions: Keras's replica scaling reads `replica_share`'s factors,
    its optimizer clips and accumulates the replicas' summed gradients, a variable summed over
    replicas adds the replicas' updates, and sharded variables are updated whole (also around the
    EMA overwrite at the end of training, in cross-replica context, where the other hooks are
    Keras's own functions).

    Installed only for the duration (Keras's functions are put back after), and
    only the threads inside `replica_share` see other factors than Keras's.
    """
    with _PATCHES.installed():
        yield
