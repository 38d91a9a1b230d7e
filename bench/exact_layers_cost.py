"""What one device's random draws and BatchNormalization statistics cost per train step on R replicas.

    python bench/exact_layers_cost.py [--model dropout|batch_norm] [--replicas 1 2 4 8] [--rounds 20]
                                      [--per-replica 32] [--steps-per-call 16] [--out FILE]

Each layout runs in a process of its own, on R logical CPU replicas. Only the
step calls are timed, as in bench/step_cost.py: each variant's compiled train
function, fed by its ArrayFeed, `--steps-per-call` steps per call. The
variants alternate call by call, their order rotating each round, and each
ratio to the first variant is taken per round (median over rounds). Each
replica takes `--per-replica` rows a step: what a round between the replicas
costs is about fixed per layer, so its share of the step falls as the rows grow.

Models and variants:
  dropout     an MLP with four Dropout layers and a GaussianNoise (a
              Dropout-heavy model):
                keras_per_replica  each replica draws the first rows of the draw, as under Keras's fit
                own_rows           the default: each replica draws its rows of one device's draw (Philox counter)
                global_draw        each replica draws the global batch's numbers and keeps its rows
  batch_norm  a small CNN with three BatchNormalization layers:
                per_replica        Trainer(batch_norm="per_replica"): each replica's statistics, as Keras's fit
                global             the default: the global batch's statistics, summed in the process
                collective         the same statistics through the strategy's all-reduce (GPUs' and workers' way)
                no_round           the default's arithmetic with no round between the replicas: each takes its
                                   own statistics for every replica's (wrong numbers; what the rounds cost)
On one replica every variant runs the same step: the row shows the noise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from unittest import mock

VARIANTS = {"dropout": ("keras_per_replica", "own_rows", "global_draw"),
            "batch_norm": ("per_replica", "global", "collective", "no_round")}


def build(model: str):
    import keras

    keras.utils.set_random_seed(0)
    if model == "dropout":
        layers = [keras.Input((256,))]
        for _ in range(4):
            layers += [keras.layers.Dense(512, activation="relu"), keras.layers.Dropout(0.3)]
        layers += [keras.layers.GaussianNoise(0.1), keras.layers.Dense(10)]
    else:
        layers = [keras.Input((28, 28, 1))]
        for filters in (16, 32, 64):
            layers += [keras.layers.Conv2D(filters, 3, padding="same", use_bias=False),
                       keras.layers.BatchNormalization(), keras.layers.ReLU(), keras.layers.MaxPooling2D()]
        layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)]
    model = keras.Sequential(layers)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


@contextlib.contextmanager
def traced_as(variant: str):
    """How the variant's step is traced: the draws hooks left out, or Philox's shortcut refused."""
    from trainer.engine import draws

    if variant == "keras_per_replica":
        saved = draws.hooks
        draws.hooks = contextlib.nullcontext
        try:
            yield
        finally:
            draws.hooks = saved
    elif variant == "no_round":
        from trainer import _compat

        collective = _compat.replicas.collective
        gathered, summed = collective.gathered, collective.replica_sum
        collective.gathered = _own_for_every_replica
        collective.replica_sum = lambda context, value: value * context.num_replicas_in_sync
        try:
            yield
        finally:
            collective.gathered, collective.replica_sum = gathered, summed
    elif variant == "collective":
        from trainer import _compat

        # the statistics through the strategy's all-reduce, as on GPUs
        with mock.patch.object(_compat.replicas.collective, "in_process", lambda strategy: False):
            yield
    elif variant == "global_draw":
        with mock.patch.object(draws, "_philox", lambda: False):  # per-example draws: the global batch's numbers
            yield
    else:
        yield


def _own_for_every_replica(context, value):
    """The replica's own part where `collective.gathered` stacks every replica's: the same ops, with no wait."""
    import tensorflow as tf

    return tf.stack([value] * context.num_replicas_in_sync)


def step_call(strategy, x, y, model: str, variant: str, per_replica: int):
    """count -> (steps run, seconds): the train function of a Trainer for `variant`, traced as it says."""
    from trainer import Trainer
    from trainer.data import boundary
    from trainer.data import inputs as inputs_lib

    options = {"batch_norm": "per_replica" if variant == "per_replica" else "global"} if model == "batch_norm" else {}
    trainer = Trainer(strategy=strategy, per_replica_batch_size=per_replica, verbose=0, **options)
    readers = inputs_lib.Readers(strategy, per_replica * strategy.num_replicas_in_sync, shuffle=True, seed=0)
    feed = readers(boundary.as_input((x, y), arg="data"), epoch=0, until=2**31)
    with traced_as(variant):
        trainer.fit(build(model), (x, y), epochs=1, steps_per_epoch=2)  # builds the engine
        steps = trainer._runs.engines[0].steps  # the step functions behind fit (not public API)
        steps.train(feed, 1)  # traces the call that the timed ones reuse

    def call(count: int) -> tuple[int, float]:
        start = time.perf_counter()
        ran = steps.train(feed, count)
        return ran, time.perf_counter() - start

    return call


def child(model: str, replicas: int, rounds: int, per_replica: int, steps_per_call: int) -> dict:
    import numpy as np
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * replicas)
    strategy = (tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)]) if replicas > 1
                else tf.distribute.get_strategy())
    rng = np.random.default_rng(0)
    n = per_replica * replicas * steps_per_call * 4
    shape = (256,) if model == "dropout" else (28, 28, 1)
    x, y = rng.random((n, *shape), dtype=np.float32), rng.integers(0, 10, n)
    names = VARIANTS[model]
    calls = {name: step_call(strategy, x, y, model, name, per_replica) for name in names}
    for call in calls.values():
        call(steps_per_call)  # warm
    times = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            ran, seconds = calls[name](steps_per_call)
            times[name].append(1000 * seconds / ran)
    base = names[0]
    return {"model": model, "replicas": replicas, "rounds": rounds, "per_replica": per_replica,
            "ms_per_step": {name: statistics.median(t) for name, t in times.items()},
            f"over_{base}": {name: statistics.median(a / b for a, b in zip(times[name], times[base]))
                             for name in names[1:]}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(VARIANTS), default="dropout")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-replica", type=int, default=32, help="rows per replica per step")
    parser.add_argument("--steps-per-call", type=int, default=16)
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.model, args.child, args.rounds, args.per_replica, args.steps_per_call)))
        return
    results = []
    for replicas in args.replicas:
        out = subprocess.run([sys.executable, __file__, "--model", args.model, "--child", str(replicas),
                              "--rounds", str(args.rounds), "--per-replica", str(args.per_replica),
                              "--steps-per-call", str(args.steps_per_call)],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    names = VARIANTS[args.model]
    print(f"{args.model}, {args.per_replica} rows per replica: ms per step (median of {args.rounds} rounds), "
          f"and each variant over {names[0]}")
    print(f"{'replicas':>8}" + "".join(f"{name:>20}" for name in names) + "".join(
        f"{name + ' ratio':>22}" for name in names[1:]))
    for row in results:
        ratios = row[f"over_{names[0]}"]
        print(f"{row['replicas']:>8}" + "".join(f"{row['ms_per_step'][n]:>20.2f}" for n in names)
              + "".join(f"{ratios[n]:>22.3f}" for n in names[1:]))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
