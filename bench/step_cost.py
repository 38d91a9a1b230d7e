"""Time per train step inside the Trainer's step calls against the bare step, call by call.

    python bench/step_cost.py [--layout none] [--rounds 40] [--steps-per-call 32] [--out FILE]

bench/throughput.py times whole `fit` calls; on a shared 2-core virtual
machine their rounds spread by 20-35%, which hides differences of a few
percent. This benchmark times only what runs inside the step calls: the
Trainer's compiled train function (its engine, built by one short `fit`, fed
by its ArrayFeed) and the bare step of bench/variants.py, each running
`--steps-per-call` steps per call. The variants alternate call by call, their
order rotating each round, so both see the same machine within a second of
each other; the ratio is taken per round (median over rounds).

Variants:
  trainer             the example's model as compiled there (loss and accuracy tracked every step)
  trainer_no_metrics  the same model compiled without metrics (only the loss tracked)
  bare_step           forward, backward and apply on batches already in memory: the floor

Per-fit costs (plan, callbacks, set-up) are left out here; throughput.py and
its per-epoch overhead figures cover them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import throughput

HERE = os.path.dirname(os.path.abspath(__file__))


def trainer_call(strategy, x, y, model):
    """count -> (steps run, seconds): the Trainer's train function on a feed of (x, y)."""
    from trainer import Trainer
    from trainer import data as data_lib

    import variants

    trainer = Trainer(strategy=strategy, per_replica_batch_size=variants.PER_REPLICA, verbose=0)
    trainer.fit(model, (x, y), epochs=1, steps_per_epoch=2)  # builds and traces the engine
    steps = trainer._engines[0].steps  # the step functions behind fit (not public API)
    global_batch = variants.PER_REPLICA * strategy.num_replicas_in_sync
    make_feed = data_lib.iterator_factory(strategy, global_batch, shuffle=True, seed=0)
    feed = make_feed(data_lib.as_input((x, y), arg="data"), epoch=0, until=2**31)

    def call(count: int) -> tuple[int, float]:
        start = time.perf_counter()
        ran = steps.train(feed, count)  # fewer at an epoch's end
        return ran, time.perf_counter() - start

    return call


def bare_call(strategy, x, y):
    """count -> (steps run, seconds): the bare step, cycling through its epoch."""
    import variants

    runner = variants.bare_step(strategy, x, y)
    position = [0]

    def call(count: int) -> tuple[int, float]:
        first = position[0] if position[0] + count <= runner.steps else 0
        start = time.perf_counter()
        runner.call(first, count)
        position[0] = first + count
        return count, time.perf_counter() - start

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layout", choices=["none", "mirrored2"], default="none")
    parser.add_argument("--examples", type=int, default=12800)
    parser.add_argument("--rounds", type=int, default=40, help="timed calls per variant")
    parser.add_argument("--steps-per-call", type=int, default=32)
    parser.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error(f"--rounds must be >= 3 for a median; got {args.rounds}")
    x, y, layouts = throughput.setup(args.examples)
    strategy = layouts[args.layout]
    import keras

    from fashion_mnist import build_model

    no_metrics = build_model()
    no_metrics.compile(optimizer=keras.optimizers.Adam(1e-3), loss=no_metrics.loss)
    calls = throughput.quietly(lambda: {
        "trainer": trainer_call(strategy, x, y, build_model()),
        "trainer_no_metrics": trainer_call(strategy, x, y, no_metrics),
        "bare_step": bare_call(strategy, x, y),
    })
    for call in calls.values():  # warm up: tracing, first-call costs
        call(args.steps_per_call)
        call(args.steps_per_call)
    throughput.one_malloc_state()
    per_step: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            ran, seconds = calls[name](args.steps_per_call)
            per_step[name].append(seconds / ran)
    ratio = {name: statistics.median(b / t for t, b in zip(times, per_step["bare_step"]))
             for name, times in per_step.items()}
    results = {"machine": throughput.machine(), "layout": args.layout, "rounds": args.rounds,
               "steps_per_call": args.steps_per_call,
               "ms_per_step": {name: 1000 * statistics.median(t) for name, t in per_step.items()},
               "speed_over_bare_step": ratio, "all_seconds_per_step": per_step}
    print(f"{args.layout}: {args.rounds} rounds of {args.steps_per_call} steps per call")
    print(f"{'variant':<20} {'ms/step':>8} {'speed / bare step':>18}")
    for name in names:
        print(f"{name:<20} {results['ms_per_step'][name]:>8.2f} {ratio[name]:>17.3f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
