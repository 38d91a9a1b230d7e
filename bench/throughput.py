"""Training throughput, side by side in one run: Keras Model.fit vs Trainer, and input pipelines.

    .venv/bin/python bench/throughput.py [--examples 8192] [--epochs 3]

Prints examples/s for each variant (the best epoch after the first, which
traces and warms up) and the ratios to Keras's Model.fit. Ratios from one run on
one machine are comparable; absolute figures vary with the machine and its load.
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def best_rate(fit_epoch, epochs, examples):
    rates = []
    for _ in range(epochs):
        start = time.perf_counter()
        fit_epoch()
        rates.append(examples / (time.perf_counter() - start))
    return max(rates[1:]) if len(rates) > 1 else rates[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    import keras
    import tensorflow as tf

    from fashion_mnist import build_model, prepare, synthetic_images
    from trainer import Trainer
    from trainer import data as data_lib

    x, y = prepare(*synthetic_images(args.examples))
    results = {}

    model = build_model()
    model.compile(optimizer=model.optimizer, loss=model.loss, metrics=["accuracy"], jit_compile=False)
    results["keras Model.fit (jit off)"] = best_rate(
        lambda: model.fit(x, y, batch_size=64, epochs=1, verbose=0), args.epochs, args.examples)

    for label, spe in (("Trainer (steps_per_execution=auto)", "auto"), ("Trainer (steps_per_execution=1)", 1)):
        trainer = Trainer(strategy="default", per_replica_batch_size=64, verbose=0, steps_per_execution=spe)
        fitted = build_model()
        results[label] = best_rate(lambda: trainer.fit(fitted, (x, y), epochs=1), args.epochs, args.examples)

    strategy = tf.distribute.get_strategy()
    inp = data_lib.as_input((x, y), arg="data")

    def batch_level():
        for _ in data_lib.distribute(strategy, inp, global_batch_size=64, num_workers=1,
                                     order=np.random.permutation(len(x))):
            pass

    def element_level():
        for _ in tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).batch(64):
            pass

    results["input only: batch-level gather (ours)"] = best_rate(batch_level, args.epochs, args.examples)
    results["input only: from_tensor_slices(...).batch"] = best_rate(element_level, args.epochs, args.examples)

    base = results["keras Model.fit (jit off)"]
    print(f"{'variant':<45} {'examples/s':>12} {'vs Model.fit':>13}")
    for label, rate in results.items():
        print(f"{label:<45} {rate:>12,.0f} {rate / base:>12.2f}x")
    ours, theirs = results["input only: batch-level gather (ours)"], results["input only: from_tensor_slices(...).batch"]
    print(f"batch-level input pipeline vs element-wise: {ours / theirs:.2f}x")
    del keras


if __name__ == "__main__":
    main()
