"""The plan printed once at the start of `fit`: what will run, and why."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from trainer.engine.fusion import TARGET_CALL_SECONDS

if TYPE_CHECKING:
    import tensorflow as tf

    from trainer.data.input_kind import Resumption

# Names TF's classes go by in the distributed-training guide.
_STRATEGY_LABELS = {
    "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy",
    "_DefaultDistributionStrategy": "default (no distribution)",
    "ParameterServerStrategyV2": "ParameterServerStrategy (asynchronous)",
}


# The measurements behind both hints: docs/performance.md (bench/onednn.py, bench/mixed_precision.py).
ONEDNN_HINT = ("oneDNN kernels off in this process; TF_ENABLE_ONEDNN_OPTS=1, set before TensorFlow starts "
               "(on every worker), may be faster for convolutions; results round differently "
               "(measure: bench/onednn.py)")

BF16_UNITS = ("AMX", "AVX512_BF16")


def bf16_hint(unit: str) -> str:
    """The plan's suggestion for CPUs whose bfloat16 `unit` oneDNN uses ("AMX" or "AVX512_BF16")."""
    return (f"this CPU computes bfloat16 natively ({unit}): Trainer(mixed_precision='mixed_bfloat16') may be "
            "faster; results round differently (measure: bench/mixed_precision.py)")


_PRECISION = {
    "float32": "float32",
    "mixed_bfloat16": "mixed_bfloat16: layers compute in bfloat16, variables and losses stay float32",
    "mixed_float16": ("mixed_float16: layers compute in float16, variables and losses stay float32, "
                      "with dynamic loss scaling"),
}


def strategy_label(strategy: tf.distribute.Strategy) -> str:
    """The strategy's name as users know it."""
    name = type(strategy).__name__
    return _STRATEGY_LABELS.get(name, name)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything `fit` decided before the first step. Pure data; `describe` renders it."""

    strategy: str
    num_replicas: int
    num_workers: int
    global_batch_size: int
    per_replica_batch_size: int
    num_examples: int | None
    steps_per_epoch: int | None
    shard_policy: str
    shard_reason: str
    lr_rule: str | None
    base_lr: str
    scaled_lr: str
    base_batch_size: int
    warmup_steps: int
    steps_per_execution: int  # the first call's, when sized from step time
    jit_compile: bool
    auto_fusion: bool = False  # steps per call sized from the measured step time
    repeated_data: bool = False  # parameter-server training: workers repeat their shards
    repeated_shards: bool = False  # data_sharding="files": each file shard repeats, every batch is full
    onednn: bool | None = None  # whether oneDNN's kernels run the CPU replicas; None: nothing to suggest
    precision: str = "float32"  # the dtype policy the model's layers compute in (models.precision)
    native_bf16: str | None = None  # the bfloat16 units ("AMX", "AVX512_BF16") of CPU replicas under oneDNN
    step: str = "the trainer's"  # whose train step runs (model_steps.ModelSteps.describe)
    batch_norm: tuple[str, ...] = ()  # BatchNormalization layers with per-replica statistics
    global_batch_norm: int = 0  # BatchNormalization layers with the global batch's statistics
    optimizer: str | None = None  # its clipping, accumulation and EMA, in words (optimizer_note)
    batch_source: str = ""  # where the global batch came from, when not the Trainer's settings
    execution_source: str = ""  # which settings chose steps per call and XLA, when not the Trainer's
    process: str = ""  # what the trainer changed for the whole process (malloc.tune_process), in words
    platform: str = ""  # untested versions or missing hooks the user opted into (_compat.check_platform)
    placement: str = ""  # how the model entered the strategy's scope (placement.Move.describe), when it moved
    cluster: str = ""  # where the tasks' cluster came from (cluster.cluster_source), on several tasks
    unguarded: tuple[str, ...] = ()  # callbacks that run on every worker without knowing it (callback_hooks.unguarded)
    resume: Resumption | None = None  # None unless a callback resumes training; then how a backup resumes the
    # input (`Input.resume`)
    draws: tuple[str, ...] = ()  # random draws an earlier fit's steps made per replica (Steps.named_draws)
    gradient_values: int = 0  # the trainable variables' values: the gradients summed over the replicas each step
    gradient_bytes: int = 0
    devices: str = ""  # the GPUs this process computes on, where it has any (strategy_lib.gpus_text)

    def __post_init__(self):
        if self.native_bf16 is not None and self.native_bf16 not in BF16_UNITS:
            raise ValueError(
                f"`native_bf16` must be None or one of {sorted(BF16_UNITS)}. Received: "
                f"native_bf16={self.native_bf16!r}. Pass the CPU's bfloat16 unit, as engine.cpu_native_bf16 returns it."
            )

    def steps_of_one_shape(self, step: int, steps: int) -> int:
        """At most `steps` steps from `step` of an epoch, stopping before its uneven last step if it lies ahead.

        A step call is one `tf.while_loop`, and a collective whose shape changes
        inside it aborts (see trainer/engine/steps.py), so the last step gets a call of
        its own wherever the trainer knows where it is.
        """
        if self.num_examples is None or self.repeated_data or not self.num_examples % self.global_batch_size:
            return steps
        last = self.num_examples // self.global_batch_size
        return min(steps, last - step) if step < last else steps

    def last_batch(self) -> str:
        """How the last partial batch is handled, in words."""
        if self.repeated_data:
            return "none: each worker repeats its shard, so every batch is full; an epoch is a step count"
        if self.repeated_shards:
            return "none: each file shard repeats, so every batch is full; an epoch is steps_per_epoch steps"
        if self.num_examples is None:
            return ("kept if partial, in a step call of its own; replicas share it unevenly (all compute one smaller "
                    "than the replica count) and losses are divided by the true global count")
        rest = self.num_examples % self.global_batch_size
        if rest == 0:
            return f"none: {self.num_examples} examples fill {self.steps_per_epoch} full batches"
        kept = f"kept, not dropped or padded, in a step call of its own: {rest} examples"
        if self.num_replicas > 1:
            share, extra = divmod(rest, self.num_replicas)
            if not share:
                kept += f" (fewer than the replicas: each of the {self.num_replicas} computes them all, counted once)"
            elif extra:
                kept += f" ({extra} replica(s) get {share + 1}, {self.num_replicas - extra} get {share})"
            else:
                kept += f" ({share} per replica)"
        return kept + "; weighted by its true size"

    def fusion(self) -> str:
        """Steps per tf.function call, in words."""
        if self.auto_fusion:
            return f"steps per call sized from the measured step time (~{TARGET_CALL_SECONDS:g} s per call)"
        return f"{self.steps_per_execution} step(s) per call"

    def precision_text(self) -> str:
        """What the layers compute in, in words, with the bfloat16 hint where it pays."""
        text = _PRECISION.get(self.precision, self.precision)
        if self.precision == "float32" and self.native_bf16:
            text += f"; {bf16_hint(self.native_bf16)}"
        return text

    def describe(self) -> str:
        steps = "unknown (until the data ends)" if self.steps_per_epoch is None else str(self.steps_per_epoch)
        lr = f"{self.base_lr} -> {self.scaled_lr}"
        if self.lr_rule:
            lr += f" ({self.lr_rule} rule, tuned for batch {self.base_batch_size})"
        else:
            lr += " (no scaling)"
        if self.warmup_steps:
            lr += f", linear warmup over {self.warmup_steps} steps"
        rows = [
            ("strategy", self.strategy),
            ("replicas", f"{self.num_replicas} in sync over {self.num_workers} worker(s)"
                         + (f"; {self.devices}" if self.devices else "")),
            *([("cluster", self.cluster)] if self.cluster else []),
            ("batch", f"global {self.global_batch_size} = {self.per_replica_batch_size} per replica "
                      f"x {self.num_replicas}"
                      + (f" ({self.batch_source})" if self.batch_source else "")),
            ("steps/epoch", steps + (f" ({self.num_examples} examples)" if self.num_examples else "")),
            ("sharding", f"{self.shard_policy}: {self.shard_reason}"),
            ("learning rate", lr),
            ("last batch", self.last_batch()),
            ("execution", f"{self.fusion()}, XLA {'on' if self.jit_compile else 'off'}"
                          + (f" ({self.execution_source})" if self.execution_source else "")),
            ("precision", self.precision_text()),
        ]
        rows.insert(1, ("train step", self.step))
        if self.placement:
            rows.insert(1, ("model", self.placement))
        if self.optimizer:
            rows.append(("optimizer", self.optimizer))
        if self.gradient_bytes and self.num_replicas > 1 and not self.repeated_data:
            rows.append(("all-reduce", f"{_size(self.gradient_bytes)} of gradients per step "
                                       f"({self.gradient_values:,} values), summed over the {self.num_replicas} "
                                       "replicas (docs/performance.md: where scaling stops)"))
        if self.global_batch_norm and self.num_replicas > 1:
            rounds = 2 * self.global_batch_norm
            between = "between the workers, each at the network's latency" if self.num_workers > 1 else (
                "between the replicas")
            rows.append(("batch norm", f"{self.global_batch_norm} BatchNormalization layer(s) normalize with the "
                                       f"global batch's mean and variance, as on one device: {rounds} small "
                                       f"all-reduces a step, one each way per layer, {between} (docs/performance.md); "
                                       "Trainer(batch_norm='per_replica') uses each replica's own, for speed"))
        if self.batch_norm and self.num_replicas > 1:
            rows.append(("batch norm", batch_norm_note(self.batch_norm, self.num_replicas)))
        if self.onednn is False:
            rows.append(("cpu kernels", ONEDNN_HINT))
        if self.unguarded and self.num_workers > 1:
            rows.append(("callbacks", unguarded_note(self.unguarded, self.num_workers)))
        if self.resume is not None:
            rows.append(("resume", resume_note(self.resume, parameter_server=self.repeated_data,
                                               global_batch_size=self.global_batch_size)))
        if self.draws:
            rows.append(("random draws", draws_note(self.draws)))
        if self.process:
            rows.append(("process", self.process))
        if self.platform:
            rows.append(("versions", self.platform))
        width = max(len(k) for k, _ in rows)
        return "Training plan\n" + "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


def draws_note(draws: tuple[str, ...]) -> str:
    """The plan's words for random draws that each replica makes on its own (trainer/engine/draws.py)."""
    return (f"not one device's: {'; '.join(draws)} (seen when this model's steps last ran); each replica "
            "draws its own numbers there. Draw over each batch-sized part, then concatenate "
            "(docs/exactness.md)")


def _size(count: int) -> str:
    """Bytes in words: "832 bytes", "12.5 KB", "102.2 MB", "1.7 GB" (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def resume_note(resumption: Resumption, *, parameter_server: bool, global_batch_size: int) -> str:
    """How exactly a backup resumes, in words: the input's `Resumption`, unless parameter servers train."""
    if parameter_server:
        return ("not exact: under parameter-server training each worker repeats its own shard and takes steps as it "
                "frees up, and a resumed run starts the workers' streams again; it trains on from the backup's "
                "weights, optimizer state and position")
    if resumption.why_not:
        return (f"not exact: {resumption.why_not}; it trains on from the backup's weights, optimizer state and "
                "position")
    layout = resumption.layout or f"on any layout with global batch {global_batch_size}"
    holds = f"; the backup holds {resumption.holds}" if resumption.holds else ""
    return f"exact: a backup resumes at its step to the uninterrupted run's numbers, {layout}{holds}"


def unguarded_note(names: tuple[str, ...] | list[str], num_workers: int) -> str:
    """What the plan says of callbacks that run on every worker without knowing it, and how to log once."""
    return (f"{', '.join(names)} run on each of the {num_workers} workers, as every callback does, so that all "
            "decide alike; wrap one that only reports somewhere shared in trainer.callbacks.ChiefOnly(...) to run "
            "it on the chief alone")


def batch_norm_note(layers: tuple[str, ...] | list[str], num_replicas: int) -> str:
    """What per-replica BatchNormalization does to the numbers, and the fix, in words."""
    named = ", ".join(layers[:4]) + (f" and {len(layers) - 4} more" if len(layers) > 4 else "")
    return (f"{named} normalize each replica's share by its own mean and variance, so training differs from "
            f"one device (and from another replica count than {num_replicas}); "
            "Trainer(batch_norm='global'), the default, gives the one-device statistics")


def optimizer_note(optimizer, num_replicas: int) -> str | None:
    """The optimizer options that act on the global gradient, in words; None if it has none."""
    parts = []
    for name in ("clipnorm", "global_clipnorm", "clipvalue"):
        value = getattr(optimizer, name, None)
        if value:
            where = " of the replicas' summed gradient" if num_replicas > 1 else ""
            parts.append(f"{name}={value:g}{where}")
    accumulate = getattr(optimizer, "gradient_accumulation_steps", None)
    if accumulate:
        parts.append(f"gradients accumulated over {accumulate} steps")
    if getattr(optimizer, "use_ema", False):
        every = getattr(optimizer, "ema_overwrite_frequency", None)
        parts.append(f"EMA of the weights (momentum {optimizer.ema_momentum:g})"
                     + (f", written to the model every {every} steps" if every else "")
                     + "; the model holds the averages after fit")
    if not parts:
        return None
    return f"{type(optimizer).__name__}: " + "; ".join(parts)
