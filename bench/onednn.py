"""oneDNN's CPU kernels on or off: the same training in fresh processes, side by side.

    python bench/onednn.py [--rounds 5] [--examples 6400]

TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it starts, and leaves oneDNN
off by default on CPUs without AVX-512 (such as this machine's). So each
measurement is a fresh process: rounds alternate between =0 and =1, and every
process trains the Trainer (no strategy) and the bare step (bench/variants.py)
for one untimed and one timed epoch each. Reported: median examples/s per
setting, the median of the per-round speed-up, and the Trainer's final loss
under each setting (oneDNN's kernels round differently).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("trainer", "bare_step")


def _child(examples: int) -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import keras
    import tensorflow as tf

    import variants
    from fashion_mnist import prepare, synthetic_images
    from throughput import quietly

    keras.utils.set_random_seed(0)  # the same initial weights in every process
    x, y = prepare(*synthetic_images(examples))
    strategy = tf.distribute.get_strategy()
    result = {}
    for name in VARIANTS:
        runner = variants.VARIANTS[name](strategy, x, y)
        quietly(runner.epoch)
        start = time.perf_counter()
        trained = quietly(runner.epoch)
        result[name] = trained / (time.perf_counter() - start)
        if name == "trainer":
            result["trainer_loss"] = float(runner.history.history["loss"][-1])
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--examples", type=int, default=6400)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.examples)
    if args.rounds < 3:
        parser.error(f"--rounds must be >= 3 for a median; got {args.rounds}")
    runs = {"0": [], "1": []}
    for _ in range(args.rounds):
        for setting in runs:
            env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "TF_CPP_MIN_LOG_LEVEL": "2"}
            out = subprocess.run([sys.executable, __file__, "--child", "--examples", str(args.examples)],
                                 env=env, capture_output=True, text=True, check=True)
            runs[setting].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'':<10} {'oneDNN off':>11} {'oneDNN on':>10} {'on / off':>9}   examples/s, medians of {args.rounds} rounds")
    for name in VARIANTS:
        off, on = ([r[name] for r in runs[s]] for s in ("0", "1"))
        gain = statistics.median(b / a for a, b in zip(off, on))
        print(f"{name:<10} {statistics.median(off):>11,.0f} {statistics.median(on):>10,.0f} {gain:>8.2f}x")
    for setting, label in (("0", "off"), ("1", "on")):
        ratio = statistics.median(r["trainer"] / r["bare_step"] for r in runs[setting])
        losses = ", ".join(f"{r['trainer_loss']:.6g}" for r in runs[setting])
        print(f"oneDNN {label}: Trainer / bare step {ratio:.2f}x; Trainer's loss after its timed epoch: {losses}")


if __name__ == "__main__":
    main()
