"""Seconds from `Trainer.fit`'s call to the end of its first step, for a model built outside the strategy's scope.

    python bench/first_step.py [--layout none|mirrored2] [--runs 3]

Prints one JSON line: for each run in this process, `first_fit` (a fresh
instance of the example's CNN: checks, moving it into the scope, building,
tracing the step, one step) and `second_fit` (the same object fitted again:
its in-scope variables filled again, the traced step reused). Tracing is
cached per process, so compare processes: run it for two commits in turn
(docs/performance.md has the command and the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", choices=["none", "mirrored2"], default="mirrored2")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if args.layout == "mirrored2":
        tf.config.set_logical_device_configuration(
            tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np

    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    from fashion_mnist import build_model

    from trainer import Trainer

    class FirstStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if self.seconds is None:
                self.seconds = time.perf_counter() - self.start

    rng = np.random.default_rng(0)
    x = rng.random((512, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 512)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if args.layout == "mirrored2" else "default"
    trainer = Trainer(strategy=strategy, per_replica_batch_size=64, steps_per_execution=1, verbose=0)
    runs = []
    for _ in range(args.runs):
        model = build_model()  # outside any scope
        seconds = {}
        for name in ("first_fit", "second_fit"):
            probe = FirstStep()
            probe.seconds, probe.start = None, time.perf_counter()
            trainer.fit(model, x, y, epochs=1, steps_per_epoch=2, callbacks=[probe])
            seconds[name] = probe.seconds
        runs.append(seconds)
    print(json.dumps({"layout": args.layout, "runs": runs,
                      "median": {k: statistics.median(r[k] for r in runs) for k in runs[0]}}))


if __name__ == "__main__":
    main()
