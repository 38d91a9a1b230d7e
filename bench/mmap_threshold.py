"""The Trainer reading tf.data, with glibc's mmap threshold as TensorFlow leaves it and as the trainer sets it.

    python bench/mmap_threshold.py [--rounds 3] [--examples 6400] [--out bench/results/mmap_threshold.json]

TensorFlow pins glibc's mmap threshold at 128 KiB the first time a process
reads a distributed tf.data iterator (trainer/engine/malloc.py), and what that costs
depends on what the process allocated before, so each measurement is a fresh
process, as a user's script or notebook kernel would be. Three settings, in an
order that rotates every round, each training the example's CNN with
`Trainer(per_replica_batch_size=64)` (its "auto" strategy: one device here)
for one untimed and three timed epochs:

  dataset         a tf.data dataset of the examples; the trainer raises the threshold
  dataset_pinned  the same with MALLOC_MMAP_THRESHOLD_=131072, TensorFlow's value, which
                  the trainer leaves alone (set from the start, not at the first step)
  arrays          the same examples as NumPy arrays (the trainer's ArrayFeed: no tf.data)
  parameter_server         the arrays under ParameterServerStrategy, launched with
                           `trainer-launch --workers 2 --ps 1`: the workers run the steps,
                           reading tf.data, and raise the threshold as they start
  parameter_server_pinned  the same with every task at TensorFlow's 128 KiB

Reported: median examples/s, minor page faults per step (of the worker and ps
tasks for the parameter-server settings), and peak RSS (of the training
script's process: the chief there).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from throughput import machine, quietly

HERE = os.path.dirname(os.path.abspath(__file__))
PINNED = {"MALLOC_MMAP_THRESHOLD_": "131072"}
SETTINGS = {"dataset": {}, "dataset_pinned": PINNED, "arrays": {}, "parameter_server": {},
            "parameter_server_pinned": PINNED}
PAIRS = {"dataset": "dataset_pinned", "parameter_server": "parameter_server_pinned"}


def _faults(setting: str) -> int:
    """Minor page faults so far: this process's, or its sibling server tasks' under the launcher."""
    if not setting.startswith("parameter_server"):
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    found = subprocess.run(["pgrep", "-P", str(os.getppid()), "-f", "trainer.launch --serve"],
                           capture_output=True, text=True).stdout.split()
    # /proc/PID/stat: after the command's ")", minflt is the 8th field.
    return sum(int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[7]) for pid in found)


def _child(setting: str, examples: int) -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import keras
    import tensorflow as tf

    from fashion_mnist import build_model, prepare, synthetic_images
    from trainer import Trainer

    x, y = prepare(*synthetic_images(examples))
    data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)) if setting.startswith("dataset") else (x, y)
    keras.utils.set_random_seed(0)
    strategy = "parameter_server" if setting.startswith("parameter_server") else "auto"
    trainer, model = Trainer(strategy=strategy, per_replica_batch_size=64, verbose=0), build_model()
    iterations = quietly(lambda: trainer.fit(model, data, epochs=1)).model.optimizer.iterations
    rates, faults = [], []
    for _ in range(3):
        before, steps, start = _faults(setting), int(iterations), time.perf_counter()
        quietly(lambda: trainer.fit(model, data, epochs=1))
        rates.append(examples / (time.perf_counter() - start))
        faults.append((_faults(setting) - before) / (int(iterations) - steps))
    print(json.dumps({"examples_per_s": statistics.median(rates), "faults_per_step": statistics.median(faults),
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def _run_child(setting: str, examples: int) -> dict:
    env = {**os.environ, **SETTINGS[setting], "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [sys.executable, __file__, "--child", setting, "--examples", str(examples)]
    if setting.startswith("parameter_server"):
        args = [sys.executable, "-m", "trainer.launch", "--workers", "2", "--ps", "1", *args[1:]]
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{setting} run failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    last = proc.stdout.strip().splitlines()[-1]
    return json.loads(last[last.index("{"):])  # the launcher prefixes the chief's lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--examples", type=int, default=6400)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "mmap_threshold.json"))
    parser.add_argument("--child", choices=list(SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.child, args.examples)
    if args.rounds < 3:
        parser.error(f"--rounds must be >= 3 for a median; got {args.rounds}")
    names = list(SETTINGS)
    runs: dict[str, list] = {name: [] for name in names}
    for i in range(args.rounds):
        for name in names[i % len(names):] + names[: i % len(names)]:
            runs[name].append(_run_child(name, args.examples))
    summary = {name: {key: statistics.median(r[key] for r in results) for key in results[0]}
               for name, results in runs.items()}
    print(f"{'':<24} {'examples/s':>11} {'page faults/step':>17} {'peak RSS MB':>12}   medians of {args.rounds}")
    for name, s in summary.items():
        print(f"{name:<24} {s['examples_per_s']:>11,.0f} {s['faults_per_step']:>17,.0f} {s['peak_rss_mb']:>12,.0f}")
    speedups = {raised: statistics.median(a["examples_per_s"] / b["examples_per_s"]
                                          for a, b in zip(runs[raised], runs[pinned]))
                for raised, pinned in PAIRS.items()}
    for raised, speedup in speedups.items():
        print(f"{raised} / {PAIRS[raised]}: {speedup:.2f}x (per round)")
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "examples": args.examples, "rounds": args.rounds, "summary": summary,
                   "speedups": speedups, "runs": runs}, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
