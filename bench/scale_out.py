"""Scale-out efficiency: W local workers (trainer-launch, one CPU replica each) against one process of W replicas.

    python bench/scale_out.py [--workers 2 4] [--runs 3] [--epochs 6] [--examples 8192] [--out FILE]

Both layouts train the same MLP on the same generated data with the same global
batch, so they compute the same numbers; what differs is how the replicas meet:
collective all-reduces over gRPC between processes, or in one process. Each run
is a fresh process (or a launcher and its workers); the first epoch (tracing,
start-up) is left out and the median of the others is the run's steady epoch.
The layouts alternate run by run, and the ratio is taken per pair of runs
(median over the runs): one process's steady epoch over the workers', so 1.0 is
as fast as one process and 0.8 is 20% slower.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

GLOBAL_BATCH = 256


def epoch_timer(seconds: list[float]):
    """A Keras callback that appends each epoch's wall seconds to `seconds`."""
    import time

    import keras

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds.append(time.perf_counter() - self.start)

    return EpochTimer()


def child(out: str, epochs: int, examples: int) -> None:
    """One layout's run: Trainer.fit with a callback that times each epoch; the chief writes the times."""
    if "REPLICAS" in os.environ:
        import tensorflow as tf

        cpus = [tf.config.LogicalDeviceConfiguration()] * int(os.environ["REPLICAS"])
        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0], cpus)
    from trainer import Trainer, cluster_info

    strategy = "multi_worker" if os.environ.get("TF_CONFIG") else "mirrored"
    trainer = Trainer(strategy=strategy, batch_size=GLOBAL_BATCH, lr_scaling=None, seed=0, verbose=0)
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.random((examples, 256), dtype=np.float32), rng.integers(0, 10, examples)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(1024, activation="relu"),
                              keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    seconds: list[float] = []
    history = trainer.fit(model, x, y, epochs=epochs, callbacks=[epoch_timer(seconds)])
    if cluster_info().is_chief:
        with open(out, "w") as f:
            json.dump({"seconds": seconds, "loss": history.history["loss"]}, f)


def run(layout: str, workers: int, epochs: int, examples: int, folder: str) -> dict:
    out = os.path.join(folder, f"{layout}{workers}.json")
    script = [os.path.abspath(__file__), "--child", out, "--epochs", str(epochs), "--examples", str(examples)]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if layout == "workers":
        command = [sys.executable, "-m", "trainer.launch", "--workers", str(workers), *script]
    else:
        command, env["REPLICAS"] = [sys.executable, *script], str(workers)
    subprocess.run(command, check=True, capture_output=True, text=True, env=env, timeout=1800)
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--examples", type=int, default=8192)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.epochs, args.examples)
        return
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for workers in args.workers:
            steady = {"one_process": [], "workers": []}
            for r in range(args.runs):
                order = ("one_process", "workers") if r % 2 == 0 else ("workers", "one_process")
                for layout in order:
                    seconds = run(layout, workers, args.epochs, args.examples, folder)["seconds"]
                    steady[layout].append(statistics.median(seconds[1:]))
            ratios = [a / b for a, b in zip(steady["one_process"], steady["workers"])]
            row = {"workers": workers, "runs": args.runs, "epochs": args.epochs, "examples": args.examples,
                   "global_batch": GLOBAL_BATCH, "steady_epoch_seconds": steady,
                   "efficiency": statistics.median(ratios)}
            results.append(row)
            print(f"{workers} workers: steady epoch {statistics.median(steady['workers']):.3f} s against "
                  f"{statistics.median(steady['one_process']):.3f} s in one process of {workers} replicas: "
                  f"efficiency {row['efficiency']:.2f}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
