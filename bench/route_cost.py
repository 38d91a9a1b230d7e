"""What the way beneath `model.fit` costs a call: `Trainer.fit` (through the model's own fit) against the
run called directly (`Runs.fit`), alternating call by call.

    python bench/route_cost.py [--rounds 30] [--examples 64]

Each call is a whole short fit of a small model (one epoch, a few steps), so
that the route's own work (hooking Keras's methods, the model's own `fit`,
binding its arguments) is a visible share of it. Prints the median time per
call of each, and their ratio per round (median over rounds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--examples", type=int, default=64)
    args = parser.parse_args()

    import keras
    import numpy as np

    from trainer import Trainer

    rng = np.random.default_rng(0)
    x, y = rng.random((args.examples, 8), dtype="float32"), rng.integers(0, 3, args.examples)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    trainer = Trainer(batch_size=16, verbose=0, nan_guard=False)
    strategy = trainer._call_strategy(None)
    variants = {
        "through model.fit": lambda: trainer.fit(model, x, y),
        "run directly": lambda: trainer._runs.fit(model, x, y, strategy=strategy),
    }
    for run in variants.values():  # trace once each
        run()
    times = {name: [] for name in variants}
    for i in range(args.rounds):
        order = list(variants) if i % 2 == 0 else list(reversed(variants))
        for name in order:
            start = time.perf_counter()
            variants[name]()
            times[name].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(times["run directly"], times["through model.fit"])]
    print(f"{args.rounds} rounds, {args.examples} examples, batch 16, one epoch per call")
    for name, values in times.items():
        print(f"{name:20s} {statistics.median(values) * 1e3:8.2f} ms/call")
    print(f"speed through model.fit / run directly: {statistics.median(ratios):.3f}x")


if __name__ == "__main__":
    sys.exit(main())
