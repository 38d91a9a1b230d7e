"""What BatchNormalization's global statistics cost a step on W local workers, against per-replica statistics.

    python bench/batch_norm_workers.py [--workers 2] [--per-worker 32 128] [--runs 3] [--epochs 5] [--out FILE]

Between CPU replicas of one process a round between the replicas is plain ops
(bench/exact_layers_cost.py); between workers it is one of TensorFlow's
collective all-reduces, over gRPC. W workers under trainer-launch, each held to
a core of its own when the machine has that many (as separate machines would
be), train exact_layers_cost.py's CNN: three BatchNormalization layers, so six
rounds a step, one forward and one backward per layer. They train it with
Trainer(batch_norm="global"), the default, and with "per_replica", the two
alternating run by run. Each run is a fresh launch, and its steady step is the
median of its epochs after the first. The script prints the ratio (median over
pairs of runs) and what a round costs: the extra time per step over six rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODES = ("per_replica", "global")
ROUNDS_PER_STEP = 6  # exact_layers_cost.build("batch_norm"): three layers, one round each way
STEPS_PER_EPOCH = 60


def child(out: str, mode: str, per_worker: int, epochs: int) -> None:
    """One run on this worker: fit the CNN, timing each epoch; the chief writes the seconds."""
    index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    workers = len(json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"])
    if workers <= len(os.sched_getaffinity(0)):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[index]})
    import numpy as np

    from exact_layers_cost import build
    from scale_out import epoch_timer
    from trainer import Trainer, cluster_info

    global_batch = per_worker * workers
    rng = np.random.default_rng(0)
    x = rng.random((global_batch * STEPS_PER_EPOCH, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, len(x))
    trainer = Trainer(strategy="multi_worker", batch_size=global_batch, lr_scaling=None, seed=0, verbose=0,
                      batch_norm=mode)
    seconds: list[float] = []
    trainer.fit(build("batch_norm"), x, y, epochs=epochs, callbacks=[epoch_timer(seconds)])
    if cluster_info().is_chief:
        with open(out, "w") as f:
            json.dump(seconds, f)


def steady_ms_per_step(mode: str, workers: int, per_worker: int, epochs: int, folder: str) -> float:
    out = os.path.join(folder, f"{mode}.json")
    command = [sys.executable, "-m", "trainer.launch", "--workers", str(workers), os.path.abspath(__file__),
               "--child", out, "--mode", mode, "--per-worker", str(per_worker), "--epochs", str(epochs)]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=1800, cwd=root,
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    with open(out) as f:
        seconds = json.load(f)
    return 1000 * statistics.median(seconds[1:]) / STEPS_PER_EPOCH


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--per-worker", type=int, nargs="+", default=[32, 128], help="rows per worker per step")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, default="global", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.mode, args.per_worker[0], args.epochs)
        return
    if args.epochs < 2:
        parser.error(f"--epochs must be at least 2 (the first, with tracing, is left out); got {args.epochs}")
    results = []
    print(f"{args.workers} workers, ms per step (steady epochs; {args.runs} runs each, alternating)")
    print(f"{'rows/worker':>12}{'per_replica':>14}{'global':>10}{'ratio':>8}{'ms per round':>14}")
    for per_worker in args.per_worker:
        steps = {mode: [] for mode in MODES}
        with tempfile.TemporaryDirectory() as folder:
            for r in range(args.runs):
                for mode in (MODES if r % 2 == 0 else MODES[::-1]):
                    steps[mode].append(steady_ms_per_step(mode, args.workers, per_worker, args.epochs, folder))
        ratio = statistics.median(g / p for g, p in zip(steps["global"], steps["per_replica"]))
        per_round = (statistics.median(steps["global"]) - statistics.median(steps["per_replica"])) / ROUNDS_PER_STEP
        results.append({"workers": args.workers, "per_worker": per_worker, "runs": args.runs,
                        "ms_per_step": steps, "ratio": ratio, "ms_per_round": per_round})
        print(f"{per_worker:>12}{statistics.median(steps['per_replica']):>14.2f}"
              f"{statistics.median(steps['global']):>10.2f}{ratio:>8.2f}{per_round:>14.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
