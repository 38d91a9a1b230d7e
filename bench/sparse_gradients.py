"""What an Embedding's sparse gradient costs reduced sparsely or densely, in fused or single-step calls.

    python bench/sparse_gradients.py [--vocab 2000 20000 200000] [--optimizer adam] [--rounds 5] [--out FILE]

Under MirroredStrategy (2 logical CPUs, TensorFlow's default collectives) an
Embedding's gradient is a `tf.IndexedSlices`, all-gathered with a row per
looked-up id. Inside one fused call (a `tf.while_loop`) that collective must
keep its shape, so the trainer runs the uneven last step in a call of its own
(trainer/engine/steps.py). The other way out would be to reduce the gradient densely,
a fixed [vocab, dim] shape, so that any steps could share a call. This
measures, per train step of a text classifier (64 ids per example, global
batch 64, each variant's best of `--rounds` passes of 64 steps):

  sparse_1     sparse reduction, one step per call
  dense_1      dense reduction, one step per call
  sparse_32    sparse reduction, 32 steps of one shape per call (what the trainer does)
  dense_32     dense reduction, 32 steps per call

The variants alternate within each round, in one process per vocabulary
(a second MirroredStrategy in one process would collide with the first's
collective keys).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SEQUENCE, GLOBAL_BATCH = 64, 64
VARIANTS = {"sparse_1": (False, 1), "dense_1": (True, 1), "sparse_32": (False, 32), "dense_32": (True, 32)}


def step_functions(vocab: int, dim: int, optimizer: str):
    """Variant name -> a traced function running its steps per call."""
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([
            keras.Input((SEQUENCE,), dtype="int32"), keras.layers.Embedding(vocab, dim),
            keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2),
        ])
        opt = keras.optimizers.Adam(1e-3) if optimizer == "adam" else keras.optimizers.SGD(0.01)
        opt.build(model.trainable_variables)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(0, vocab, size=(GLOBAL_BATCH, SEQUENCE)), tf.int32)
    y = tf.constant(rng.integers(0, 2, size=GLOBAL_BATCH))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")
    per_replica = GLOBAL_BATCH // 2

    def step(dense: bool):
        def replica():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            xs, ys = x[r * per_replica:(r + 1) * per_replica], y[r * per_replica:(r + 1) * per_replica]
            with tf.GradientTape() as tape:
                loss = loss_fn(ys, model(xs, training=True)) / GLOBAL_BATCH
            grads = tape.gradient(loss, model.trainable_variables)
            if dense:
                grads = [tf.convert_to_tensor(g) for g in grads]
            opt.apply_gradients(zip(grads, model.trainable_variables))
        strategy.run(replica)

    def fused(dense: bool, steps: int):
        @tf.function
        def call():
            for _ in tf.range(steps):
                step(dense)
        return call

    return {name: (fused(dense, steps), steps) for name, (dense, steps) in VARIANTS.items()}


def measure(vocab: int, dim: int, optimizer: str, rounds: int) -> dict[str, float]:
    """Variant -> milliseconds per step (best round)."""
    functions = step_functions(vocab, dim, optimizer)
    for call, _ in functions.values():
        call()  # trace
    best = {name: float("inf") for name in functions}
    for _ in range(rounds):
        for name, (call, steps) in functions.items():
            start = time.perf_counter()
            for _ in range(64 // steps):
                call()
            best[name] = min(best[name], (time.perf_counter() - start) / 64 * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, nargs="+", default=[2000, 20000, 200000])
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one vocabulary, in this process
    args = parser.parse_args()
    if args.child:
        import tensorflow as tf

        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                                   [tf.config.LogicalDeviceConfiguration()] * 2)
        print(json.dumps(measure(args.vocab[0], args.dim, args.optimizer, args.rounds)))
        return
    results = []
    for vocab in args.vocab:
        command = [sys.executable, __file__, "--child", "--vocab", str(vocab), "--dim", str(args.dim),
                   "--optimizer", args.optimizer, "--rounds", str(args.rounds)]
        child = subprocess.run(command, capture_output=True, text=True, check=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        ms = json.loads(child.stdout.strip().splitlines()[-1])
        row = {"vocab": vocab, "dim": args.dim, "optimizer": args.optimizer, "ms_per_step": ms,
               "dense_32_over_sparse_32": ms["dense_32"] / ms["sparse_32"],
               "sparse_1_over_sparse_32": ms["sparse_1"] / ms["sparse_32"]}
        results.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cpu_count": os.cpu_count(), "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
