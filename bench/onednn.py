"""oneDNN's CPU kernels on or off: the same training in fresh processes, side by side.

    python bench/onednn.py [--rounds 5] [--examples 6400] [--out bench/results/onednn.json]

TensorFlow reads TF_ENABLE_ONEDNN_OPTS once, when it starts; unset, oneDNN is
on only on Linux CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX (not this
machine's). So each measurement is a fresh process. Rounds alternate between
=0 and =1 (which goes first flips every round), and every process trains the
Trainer (no strategy) and the bare step (bench/variants.py), in an order that
also flips, for one untimed and three timed epochs each. Reported: the median
examples/s per setting, the median of the per-round speed-ups, and the
Trainer's mean loss over its last epoch under each setting (oneDNN's kernels
round differently). Each process checks that TensorFlow obeyed the variable.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from throughput import machine, quietly, split_cpu

HERE = os.path.dirname(os.path.abspath(__file__))
VARIANTS = ("trainer", "bare_step")


def _child(examples: int, flip: bool) -> None:
    split_cpu(2)  # as in bench/throughput.py
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import keras
    import tensorflow as tf

    import variants
    from fashion_mnist import prepare, synthetic_images
    from trainer._compat import onednn_enabled

    x, y = prepare(*synthetic_images(examples))
    strategy = tf.distribute.get_strategy()
    result = {"onednn": onednn_enabled()}
    for name in reversed(VARIANTS) if flip else VARIANTS:
        keras.utils.set_random_seed(0)  # the same initial weights in every process, whatever the order
        runner = variants.VARIANTS[name](strategy, x, y)
        quietly(runner.epoch)
        rates = []
        for _ in range(3):
            start = time.perf_counter()
            trained = quietly(runner.epoch)
            rates.append(trained / (time.perf_counter() - start))
        result[name] = statistics.median(rates)
        if name == "trainer":
            result["trainer_loss"] = float(runner.history.history["loss"][-1])
    print(json.dumps(result))


def _run_child(setting: str, examples: int, flip: bool) -> dict:
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": setting, "TF_CPP_MIN_LOG_LEVEL": "2"}
    args = [sys.executable, __file__, "--child", "--examples", str(examples)] + (["--flip"] if flip else [])
    proc = subprocess.run(args, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"TF_ENABLE_ONEDNN_OPTS={setting} run failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if result["onednn"] is not None and result["onednn"] != (setting == "1"):
        raise RuntimeError(f"TensorFlow ignored TF_ENABLE_ONEDNN_OPTS={setting} (oneDNN on: {result['onednn']})")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--examples", type=int, default=6400)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "onednn.json"))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flip", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args.examples, args.flip)
    if args.rounds < 3:
        parser.error(f"--rounds must be >= 3 for a median; got {args.rounds}")
    runs: dict[str, list] = {"0": [], "1": []}
    for i in range(args.rounds):
        for setting in ("1", "0") if i % 2 else ("0", "1"):
            runs[setting].append(_run_child(setting, args.examples, flip=bool(i % 2)))
    summary = {}
    print(f"{'':<10} {'oneDNN off':>11} {'oneDNN on':>10} {'on / off':>9}   "
          f"examples/s, medians of {args.rounds} rounds")
    for name in VARIANTS:
        off, on = ([r[name] for r in runs[s]] for s in ("0", "1"))
        summary[name] = {"off": statistics.median(off), "on": statistics.median(on),
                         "speedup": statistics.median(b / a for a, b in zip(off, on))}
        print(f"{name:<10} {summary[name]['off']:>11,.0f} {summary[name]['on']:>10,.0f} "
              f"{summary[name]['speedup']:>8.2f}x")
    for setting, label in (("0", "off"), ("1", "on")):
        ratio = statistics.median(r["trainer"] / r["bare_step"] for r in runs[setting])
        losses = ", ".join(f"{r['trainer_loss']:.6g}" for r in runs[setting])
        print(f"oneDNN {label}: Trainer / bare step {ratio:.2f}x; Trainer's mean loss over its last epoch: {losses}")
    with open(args.out, "w") as f:
        json.dump({"machine": machine(), "examples": args.examples, "rounds": args.rounds, "summary": summary,
                   "runs": runs}, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
