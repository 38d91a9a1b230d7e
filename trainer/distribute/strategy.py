"""Strategy names (and their options) -> `tf.distribute.Strategy` instances, and which strategy a model goes with.
"""

from __future__ import annotations

import difflib
import os
from typing import Any

import tensorflow as tf

from trainer import _compat
from trainer.distribute.cluster import EVALUATOR, ClusterInfo, cluster_info
from trainer.distribute import gpus
from trainer.distribute.collectives import mirrored_strategy
from trainer.distribute.slurm import slurm_addresses, slurm_step

STRATEGY_NAMES = (
    "auto",
    "default",
    "one_device",
    "mirrored",
    "central_storage",
    "multi_worker",
    "parameter_server",
    "tpu",
)

# Environment variables that say a TPU may be reachable. Without one of them,
# "auto" never asks TPUClusterResolver, which would otherwise probe the GCE
# metadata server and can block for a long time off Google Cloud.
_TPU_HINTS = ("TPU_NAME", "TPU_WORKER_ID", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE")


def auto_strategy_name(info: ClusterInfo, num_gpus: int, tpu_hinted: bool) -> str:
    """The name "auto" resolves to: TPU, then cluster, then GPUs, then the default strategy.

    On one device that is what `model.fit` runs under: no distribution, so the
    model is used as it was built (nothing is re-created in a scope).
    """
    if tpu_hinted:
        return "tpu"
    if info.num_ps > 0:
        return "parameter_server"
    if info.num_workers > 1:
        return "multi_worker"
    if num_gpus > 1:
        return "mirrored"
    return "default"


DEFAULT_COLLECTIVE_TIMEOUT = 300.0  # seconds before a collective gives up on a silent peer

_CROSS_DEVICE_OPS = {
    "nccl": tf.distribute.NcclAllReduce,
    "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
    "reduction_to_one_device": tf.distribute.ReductionToOneDevice,
}
_COMMUNICATION = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def resolve_strategy(strategy: str | tf.distribute.Strategy | None, **options: Any) -> tf.distribute.Strategy:
    """Returns a strategy instance for a name (with options) or an instance.

    Args:
      strategy: a `tf.distribute.Strategy`, None (the current strategy), or one of
        `STRATEGY_NAMES`.
      **options: for the named strategy:
        "one_device": device.
        "mirrored": devices (a subset, e.g. ["/gpu:0", "/gpu:1"]), cross_device_ops
          ("nccl", "hierarchical_copy", "reduction_to_one_device" or an instance).
        "central_storage": devices.
        "multi_worker": communication ("auto", "ring", "nccl"), timeout_seconds
          (per collective; a dead peer then raises instead of hanging).

    Raises:
      ValueError: for an unknown name or option value, or "tpu" when no TPU can be reached.
      TypeError: for an option the strategy does not take.
    """
    if isinstance(strategy, tf.distribute.Strategy):
        return strategy
    if strategy is None:
        return tf.distribute.get_strategy()
    check_strategy_name(strategy)
    if cluster_info().task_type == EVALUATOR:  # (a malformed TF_CONFIG gets our error before TensorFlow's)
        raise ValueError(
            "This process is the cluster's evaluator task, which the trainer does not run. Received: TF_CONFIG "
            f"with task type {EVALUATOR!r} (Kubeflow's TFJob sets it for an Evaluator replica). The trainer "
            "evaluates on the training workers themselves, exactly: pass validation_data to fit(). Remove the "
            "Evaluator replica from the job, or evaluate a saved checkpoint in a job of its own."
        )
    name = strategy
    if name == "auto":
        tpu_hinted = any(os.environ.get(k) for k in _TPU_HINTS)
        name = auto_strategy_name(cluster_info(), 0, tpu_hinted)
        if name == "default":  # only now look at devices: listing them starts TensorFlow,
            # after which a multi-worker strategy could no longer be created
            name = auto_strategy_name(cluster_info(), len(tf.config.list_logical_devices("GPU")), tpu_hinted)
        options = {}  # options are for an explicit name
    builder = _BUILDERS[name]
    allowed = _OPTIONS[name]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(
            f"Strategy {name!r} takes no option(s) {unknown}. Received: {options}. "
            f"Options it takes: {list(allowed) or 'none'}."
        )
    return builder(**options)


def runs_on_accelerators(strategy: tf.distribute.Strategy) -> bool:
    """Whether the strategy's replicas run on GPUs or TPUs (for the default strategy: whether TF sees a GPU)."""
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return True
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy: whatever TF places on
        devices = [d.name for d in tf.config.list_logical_devices("GPU")]
    return any("GPU" in d.upper() for d in devices)


def gpus_text(strategy: tf.distribute.Strategy) -> str:
    """For the plan's replicas row: the GPUs this process's replicas run on, and the CUDA_VISIBLE_DEVICES
    that chose them ("this worker: GPU:0, GPU:1 of CUDA_VISIBLE_DEVICES=2,3"); "" without GPUs."""
    if isinstance(strategy, tf.distribute.TPUStrategy) or not runs_on_accelerators(strategy):
        return ""
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:
        devices = [d.name for d in tf.config.list_logical_devices("GPU")]
    names = ", ".join(d.rsplit("device:", 1)[-1] for d in devices if "GPU" in d.upper())
    if not names:
        return ""
    chosen = os.environ.get(gpus.VISIBLE)
    return f"this worker: {names}" + (f" of {gpus.VISIBLE}={chosen}" if chosen is not None else "")


def check_strategy_name(strategy: Any) -> None:
    """Raises a clear error unless `strategy` is a known name or an instance."""
    if isinstance(strategy, tf.distribute.Strategy) or strategy is None:
        return
    if not isinstance(strategy, str):
        raise TypeError(
            "`strategy` must be a tf.distribute.Strategy or a name. "
            f"Received: strategy={strategy!r} of type {type(strategy).__name__}. "
            f"Pass one of {', '.join(STRATEGY_NAMES)}."
        )
    if strategy not in STRATEGY_NAMES:
        guess = closest_name(strategy)
        raise ValueError(
            f"`strategy` must be one of {', '.join(STRATEGY_NAMES)} or a tf.distribute.Strategy. Received: "
            f"strategy={strategy!r}. " + (f"Did you mean {guess!r}?" if guess else "Pass one of those names.")
        )


def closest_name(name: str) -> str | None:
    """The strategy name nearest to a misspelt one, or None."""
    matches = difflib.get_close_matches(name.lower(), STRATEGY_NAMES, n=1, cutoff=0.7)
    return matches[0] if matches else None


def _compute_devices() -> list[str]:
    """GPUs if any, else every logical CPU (so CPU-only machines can simulate replicas)."""
    gpus = tf.config.list_logical_devices("GPU")
    return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]


def _one_device(device: str | None = None) -> tf.distribute.Strategy:
    return tf.distribute.OneDeviceStrategy(device or _compute_devices()[0])


def _mirrored(devices: list[str] | None = None, cross_device_ops: Any = None) -> tf.distribute.Strategy:
    if isinstance(cross_device_ops, str):
        if cross_device_ops not in _CROSS_DEVICE_OPS:
            raise ValueError(
                f"Unknown `cross_device_ops`. Received: cross_device_ops={cross_device_ops!r}. "
                f"Pass one of {sorted(_CROSS_DEVICE_OPS)} or a tf.distribute.CrossDeviceOps instance."
            )
        cross_device_ops = _CROSS_DEVICE_OPS[cross_device_ops]()
    return mirrored_strategy(devices or _compute_devices(), cross_device_ops)


def _central_storage(devices: list[str] | None = None) -> tf.distribute.Strategy:
    return tf.distribute.experimental.CentralStorageStrategy(compute_devices=devices or _compute_devices())


class AnotherMultiWorker(ValueError):
    """A multi-worker strategy asked for in a process that runs one made elsewhere (TensorFlow runs one)."""


# The MultiWorkerMirroredStrategy this module made, after the options it was made with: TensorFlow runs one per
# process, so every Trainer of the process shares it.
_made_multi_worker: tuple[tuple, tf.distribute.Strategy] | None = None


def _multi_worker(communication: str = "auto", timeout_seconds: float | None = DEFAULT_COLLECTIVE_TIMEOUT):
    if communication not in _COMMUNICATION:
        raise ValueError(
            f"Unknown `communication`. Received: communication={communication!r}. Pass one of {sorted(_COMMUNICATION)}."
        )
    global _made_multi_worker
    wanted = (communication, timeout_seconds)
    if _made_multi_worker is not None:  # a call without options ("auto") takes it as it is
        made_with, made = _made_multi_worker
        if made_with != wanted and wanted != ("auto", DEFAULT_COLLECTIVE_TIMEOUT):
            raise ValueError(
                "This process runs a MultiWorkerMirroredStrategy already, and TensorFlow runs one per process. "
                f"Received: communication={communication!r}, timeout_seconds={timeout_seconds!r}, where the one "
                f"running has communication={made_with[0]!r}, timeout_seconds={made_with[1]!r}. Pass the same "
                "options, or use one process per configuration."
            )
        return made
    if _compat.collectives_serve_a_cluster():
        raise AnotherMultiWorker(
            "`strategy` must be the MultiWorkerMirroredStrategy this process runs already: TensorFlow runs one "
            "per process, and a second one aborts the first's collectives. Received: a Trainer that would make "
            "its own, in a process where `tf.distribute.MultiWorkerMirroredStrategy()` was made before. Pass it: "
            "Trainer(strategy=strategy), or build the model in its `with strategy.scope():` and keep the "
            "Trainer's strategy 'auto' (the model then trains on it, as under model.fit)."
        )
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=_COMMUNICATION[communication], timeout_seconds=timeout_seconds
    )
    try:
        # A worker's logical CPUs are replicas, as under MirroredStrategy; a SIGTERM still ends the task.
        with _compat.worker_cpu_replicas(), _compat.sigterm_kept():
            made = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=_slurm_resolver(),
                                                             communication_options=options)
        _made_multi_worker = (wanted, made)
        return made
    except RuntimeError as err:
        if "program startup" not in str(err):
            raise
        raise RuntimeError(
            "MultiWorkerMirroredStrategy must be created before TensorFlow runs anything. Create the "
            "Trainer (or the strategy) at the top of the script, before building models or data."
        ) from err


def _slurm_resolver() -> tf.distribute.cluster_resolver.ClusterResolver | None:
    """Under an `srun` of several tasks and no TF_CONFIG, the cluster Slurm started; else None (TF_CONFIG's).

    Each task computes every task's address alike (`slurm.slurm_addresses`) and
    computes on the GPUs Slurm let it see (CUDA_VISIBLE_DEVICES, as Slurm set it);
    where Slurm bound none to each task and several share the node, on its share
    by SLURM_LOCALID (`gpus.slurm_share`), made visible before TensorFlow starts
    its devices, which a MultiWorkerMirroredStrategy needs anyway.
    """
    step = slurm_step()
    if os.environ.get("TF_CONFIG") or step is None or step.num_tasks < 2:
        return None
    addresses = slurm_addresses(step, _compat.expand_hostlist, _compat.expand_tasks_per_node)
    devices = tf.config.list_physical_devices("GPU")
    share = gpus.slurm_share(os.environ, [str(i) for i in range(len(devices))]) if devices else None
    if share is not None:
        first, own, _ = share
        devices = devices[first:first + len(own)]
        tf.config.set_visible_devices(devices, "GPU")
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": addresses}), task_type="worker", task_id=step.task_id, rpc_layer="grpc",
        num_accelerators={"GPU": len(devices)})


def _parameter_server() -> tf.distribute.Strategy:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not resolver.cluster_spec().as_dict().get("ps"):
        raise ValueError(
            "`strategy='parameter_server'` needs a cluster with at least one 'ps' task. "
            f"Received: TF_CONFIG={os.environ.get('TF_CONFIG')!r}. "
            "Set TF_CONFIG (or use trainer-launch --ps 1) before creating the strategy."
        )
    return tf.distribute.ParameterServerStrategy(resolver)


def _tpu() -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as err:
        raise ValueError(
            "`strategy='tpu'` found no reachable TPU. Received: strategy='tpu'. "
            "Run on a TPU VM (or set TPU_NAME), or pick another strategy. "
            f"TensorFlow said: {err}"
        ) from err
    return tf.distribute.TPUStrategy(resolver)


_BUILDERS = {
    "default": tf.distribute.get_strategy,
    "one_device": _one_device,
    "mirrored": _mirrored,
    "central_storage": _central_storage,
    "multi_worker": _multi_worker,
    "parameter_server": _parameter_server,
    "tpu": _tpu,
}
_OPTIONS = {
    "default": (),
    "one_device": ("device",),
    "mirrored": ("devices", "cross_device_ops"),
    "central_storage": ("devices",),
    "multi_worker": ("communication", "timeout_seconds"),
    "parameter_server": (),
    "tpu": (),
}
