"""The self-check: whether one device's numbers hold on this machine, and what its replicas give.

    python -m trainer.check                      # this process: every GPU it sees, or 2 CPU replicas
    trainer-launch --workers 2 --check           # every worker of a local cluster
    srun -n 2 python -m trainer.check            # the tasks of a Slurm step

It prints the versions (Python, TensorFlow, Keras, the trainer; CUDA, cuDNN and NCCL as the installed
TensorFlow reports them), the devices, oneDNN and XLA, and the cluster this process is part of. Then it trains
a small model (Dropout, an accuracy metric, an uneven last batch) on one device and on every replica, and
reports the largest weight difference, and the examples per second on each. It exits with status 1 when the
replicas' numbers are not one device's, 0 when they are. The output is what a bug report needs
(docs/troubleshooting.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import sys
import time
from typing import Any, Sequence

from trainer.quiet import startup_notices_hidden

# The largest difference allowed between one device's fit and the replicas' (weights, history, evaluate). On 2
# CPU replicas here rounding alone gave 6e-8; one example left out of the fit moved the weights 0.12, one
# read twice 0.04. The limit leaves GPUs' reductions, whose order varies, room for their rounding.
WEIGHT_LIMIT = 1e-4
EXAMPLES, BATCH, EPOCHS = 203, 32, 2  # 6 full global batches and one of 11
SPEED_EXAMPLES, SPEED_BATCH, SPEED_EPOCHS = 65536, 256, 3


@dataclasses.dataclass
class Result:
    """One check's figures: the one-device and replica runs' largest differences, and their speeds."""

    replicas: int
    weights: float
    history: float
    evaluate: float
    one_device_rate: float
    replicas_rate: float

    @property
    def holds(self) -> bool:
        return max(self.weights, self.history, self.evaluate) <= WEIGHT_LIMIT


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m trainer.check", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.split("\n")[1:]))
    parser.add_argument("--cpu-replicas", type=int, default=None, metavar="N",
                        help="on a machine without GPUs, N logical CPU devices as the replicas (default: 2 for "
                             "one process, 1 per task of a cluster)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = parser.parse_args(argv)
    if args.cpu_replicas is not None and args.cpu_replicas < 1:
        parser.error(f"--cpu-replicas must be an integer >= 1. Received: --cpu-replicas {args.cpu_replicas}. "
                     "Pass e.g. --cpu-replicas 2.")
    return args


def versions(tf) -> dict[str, str]:
    """Python, TensorFlow, Keras and the trainer; CUDA and cuDNN as TensorFlow was built with them; NCCL as
    pip installed it (TensorFlow's CUDA wheels bring it as nvidia-nccl-cu12)."""
    import keras

    import trainer

    build = tf.sysconfig.get_build_info()
    found = {"python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__,
             "trainer": trainer.__version__}
    if build.get("is_cuda_build"):
        found["cuda"], found["cudnn"] = str(build.get("cuda_version", "?")), str(build.get("cudnn_version", "?"))
    else:
        found["cuda"] = "not a CUDA build"
    for package in ("nvidia-nccl-cu12", "nvidia-nccl-cu13"):
        try:
            found["nccl"] = f"{importlib.metadata.version(package)} ({package})"
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    else:
        found["nccl"] = "not installed"
    return found


def machine(tf, cpu_replicas: int) -> dict[str, str]:
    """The devices, the CPU's vector units, oneDNN, what the trainer's jit_compile="auto" picks, the cluster."""
    from trainer import _compat
    from trainer.distribute.cluster import cluster_source
    from trainer.engine import engine

    gpus = tf.config.list_physical_devices("GPU")
    flags = engine.cpu_flags()
    units = [name for flag, name in (("avx2", "AVX2"), ("avx512f", "AVX512F"), ("avx512_vnni", "AVX512_VNNI"),
                                     ("avx512_bf16", "AVX512_BF16"), ("amx_bf16", "AMX")) if flag in flags]
    onednn = _compat.onednn_enabled()
    return {
        "gpus": ", ".join(f"{d.name.split('device:')[-1]}" for d in gpus) or "none",
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "unset"),
        "cpu": f"{os.cpu_count()} cores, {platform.machine()}" + (f", {' '.join(units)}" if units else ""),
        "replicas": (f"{len(gpus)} GPU(s)" if gpus else f"{cpu_replicas} logical CPU device(s) (--cpu-replicas)"),
        "onednn": {True: "on", False: "off", None: "unknown"}[onednn]
                  + (f" (TF_ENABLE_ONEDNN_OPTS={os.environ['TF_ENABLE_ONEDNN_OPTS']})"
                     if "TF_ENABLE_ONEDNN_OPTS" in os.environ else ""),
        "xla": ('jit_compile="auto" turns it on for the GPUs, where Keras lets a model have it' if gpus else
                'off under jit_compile="auto" on CPUs; Trainer(jit_compile=True) turns it on'),
        "cluster": cluster_source() or "this process alone (no TF_CONFIG, no Slurm step of several tasks)",
    }


def _model(keras, features: int, width: int, classes: int):
    model = keras.Sequential([keras.Input((features,)), keras.layers.Dense(width, activation="gelu"),
                              keras.layers.Dropout(0.25, seed=1), keras.layers.Dense(classes)])
    model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _flat(model):
    import numpy as np

    return np.concatenate([w.ravel() for w in model.get_weights()])


def exactness(tf, distributed) -> tuple[float, float, float, int]:
    """The largest differences between one device and `distributed`'s replicas after the same fit: weights,
    history and evaluate; and the replica count."""
    import keras
    import numpy as np

    from trainer.trainer import Trainer

    rng = np.random.default_rng(7)
    x = rng.normal(size=(EXAMPLES, 12)).astype("float32")
    y = (x[:, :4].sum(axis=1) > 0).astype("int32") + (x[:, 4] > 1).astype("int32")
    runs = []
    for trainer in (Trainer(strategy=tf.distribute.get_strategy(), batch_size=BATCH, lr_scaling=None, seed=0,
                            verbose=0), distributed):
        history = trainer.fit(lambda: _model(keras, 12, 32, 3), x, y, epochs=EPOCHS, validation_split=0.2)
        evaluation = trainer.evaluate(history.model, x, y, return_dict=True)
        runs.append((history.history, evaluation, _flat(history.model)))
    (h1, e1, w1), (h2, e2, w2) = runs
    history = max(float(np.max(np.abs(np.subtract(h1[k], h2[k])))) for k in h1)
    evaluate = max(abs(e1[k] - e2[k]) for k in e1)
    return float(np.max(np.abs(w1 - w2))), history, evaluate, distributed.strategy.num_replicas_in_sync


def speed(tf, trainer) -> float:
    """Examples per second of `trainer`'s fit (all its replicas, over every worker), on the second of two fits
    of the same model, after the first traced the steps."""
    import keras
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.normal(size=(SPEED_EXAMPLES, 64)).astype("float32")
    y = rng.integers(0, 10, SPEED_EXAMPLES)
    model = trainer.fit(lambda: _model(keras, 64, 256, 10), x, y, epochs=1, verbose=0).model
    start = time.perf_counter()
    trainer.fit(model, x, y, epochs=SPEED_EPOCHS, verbose=0)
    return SPEED_EPOCHS * SPEED_EXAMPLES / (time.perf_counter() - start)


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    clustered = bool(os.environ.get("TF_CONFIG")) or int(os.environ.get("SLURM_STEP_NUM_TASKS", "1") or 1) > 1
    cpu_replicas = args.cpu_replicas or (1 if clustered else 2)
    started = time.perf_counter()
    with startup_notices_hidden():  # TensorFlow's, and CUDA's when it looks for GPUs
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
    if not gpus and cpu_replicas > 1:
        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                                   [tf.config.LogicalDeviceConfiguration()] * cpu_replicas)
    from trainer.distribute.cluster import cluster_info
    from trainer.distribute.strategy import resolve_strategy
    from trainer.trainer import Trainer

    # first: a multi-worker strategy must exist before TensorFlow runs anything else
    strategy = resolve_strategy("auto" if clustered or gpus else "mirrored")
    distributed = Trainer(strategy=strategy, batch_size=BATCH, lr_scaling=None, seed=0, verbose=0)
    report: dict[str, Any] = {"versions": versions(tf), "machine": machine(tf, cpu_replicas)}
    weights, history, evaluate, replicas = exactness(tf, distributed)
    one_device = Trainer(strategy=tf.distribute.get_strategy(), batch_size=SPEED_BATCH, lr_scaling=None, seed=0,
                         verbose=0)
    wide = Trainer(strategy=strategy, batch_size=SPEED_BATCH, lr_scaling=None, seed=0, verbose=0)
    result = Result(replicas, weights, history, evaluate, speed(tf, one_device), speed(tf, wide))
    report["exactness"] = {"replicas": replicas, "weights": weights, "history": history, "evaluate": evaluate,
                           "limit": WEIGHT_LIMIT, "holds": result.holds}
    efficiency = result.replicas_rate / result.one_device_rate / replicas
    report["speed"] = {"one_device": result.one_device_rate, "replicas": result.replicas_rate,
                       "efficiency": efficiency}
    report["seconds"] = time.perf_counter() - started
    info = cluster_info()
    if args.json:
        print(json.dumps(report))
    elif info.is_chief:
        print(describe(report))
    else:
        print(f"worker {info.task_id}: {_verdict(report)}")
    return 0 if result.holds else 1


def _verdict(report: dict) -> str:
    e = report["exactness"]
    if e["holds"]:
        return (f"PASS: one device's numbers hold on {e['replicas']} replica(s): weights {e['weights']:.1e} "
                f"apart (limit {e['limit']:.0e})")
    return (f"FAIL: {e['replicas']} replica(s) trained other numbers than one device: weights {e['weights']:.1e}, "
            f"history {e['history']:.1e}, evaluate {e['evaluate']:.1e} apart (limit {e['limit']:.0e}). Please "
            "report it with this output (docs/troubleshooting.md)")


def describe(report: dict) -> str:
    """The report as the chief prints it: one row per subject."""
    v, m, e, s = report["versions"], report["machine"], report["exactness"], report["speed"]
    shared = "; CPU replicas on one machine share its cores" if m["gpus"] == "none" and e["replicas"] > 1 else ""
    rows = [
        ("versions", f"Python {v['python']}, TensorFlow {v['tensorflow']}, Keras {v['keras']}, trainer {v['trainer']}"),
        ("cuda", (f"TensorFlow built for CUDA {v['cuda']} and cuDNN {v['cudnn']}" if "cudnn" in v else v["cuda"])
                 + f"; NCCL {v['nccl']}" + ("" if "nvidia" in v["nccl"] or "cudnn" not in v else
                                             ' (pip install "tensorflow[and-cuda]" brings the CUDA libraries)')),
        ("gpus", f"{m['gpus']} (CUDA_VISIBLE_DEVICES {m['cuda_visible_devices']})"),
        ("cpu", m["cpu"]),
        ("onednn", m["onednn"]),
        ("xla", m["xla"]),
        ("cluster", m["cluster"]),
        ("replicas", f"{e['replicas']} in sync: {m['replicas']} per process"),
        ("exactness", f"one device against {e['replicas']} replica(s), {EXAMPLES} examples in global batches of "
                      f"{BATCH} with Dropout: weights {e['weights']:.1e}, history {e['history']:.1e}, evaluate "
                      f"{e['evaluate']:.1e} apart (limit {e['limit']:.0e})"),
        ("speed", f"{s['one_device']:,.0f} examples/s on one device, {s['replicas']:,.0f} on {e['replicas']} "
                  f"replica(s): {s['efficiency']:.2f} of linear scaling{shared}"),
        ("result", _verdict(report)),
    ]
    width = max(len(name) for name, _ in rows) + 2
    return "\n".join([f"trainer self-check ({report['seconds']:.0f} s)"]
                     + [f"  {name.ljust(width)}{text}" for name, text in rows])


if __name__ == "__main__":
    sys.exit(main())
