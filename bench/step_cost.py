"""Time per train step inside the Trainer's step calls against the bare step, call by call.

    python bench/step_cost.py [--layout none] [--rounds 40] [--steps-per-call 32] [--profile-rounds 9] [--out FILE]

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

With `--profile-rounds N`, N calls of each variant first run under the
TensorFlow profiler (host tracer, as in bench/kernel_profile.py; before the
timed calls, see `profile`), and it reports, per step, each op type's summed
time and number of op events, and the op types that the Trainer's step runs
more often than the bare step: what it runs beyond the floor, and what those
ops cost.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

import kernel_profile
import throughput

HERE = os.path.dirname(os.path.abspath(__file__))


def trainer_call(strategy, x, y, model):
    """count -> (steps run, seconds): the Trainer's train function on a feed of (x, y)."""
    from trainer import Trainer
    from trainer.data import boundary
    from trainer.data import inputs as inputs_lib

    import variants

    trainer = Trainer(strategy=strategy, per_replica_batch_size=variants.PER_REPLICA, verbose=0)
    trainer.fit(model, (x, y), epochs=1, steps_per_epoch=2)  # builds and traces the engine
    steps = trainer._runs.engines[0].steps  # the step functions behind fit (not public API)
    global_batch = variants.PER_REPLICA * strategy.num_replicas_in_sync
    readers = inputs_lib.Readers(strategy, global_batch, shuffle=True, seed=0)
    feed = readers(boundary.as_input((x, y), arg="data"), epoch=0, until=2**31)

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


def profiled_call(call, count: int) -> dict:
    """One call under the profiler: wall ms per step, and per op type its ms and op events per step."""
    (ran, seconds), xspace = kernel_profile.traced(lambda: call(count))
    ms, events = collections.Counter(), collections.Counter()
    for op_type, _, duration_ps in kernel_profile.host_op_events(xspace):
        ms[op_type] += duration_ps / 1e9 / ran
        events[op_type] += 1 / ran
    return {"wall_ms": 1000 * seconds / ran, "op_type_ms": dict(ms), "op_type_events": dict(events)}


def profile(calls: dict, rounds: int, count: int) -> dict:
    """Medians over `rounds` profiled calls of each variant, the order rotating each round.

    Run it before any other call but the first (which traces): after a few
    unprofiled calls, TensorFlow's executor deems cheap ops inexpensive, runs
    them inline, and the host tracer stops recording them (seen on TF 2.21;
    profiled calls do not lower the estimates). So these are the ops and times
    of calls in which every op still goes through the executor's thread pool:
    an upper bound on what the cheap ops cost once warm. The first round also
    pays any first-call costs, which the median over rounds leaves out.
    `events_per_round` shows whether each variant's op count stayed the same
    from round to round.
    """
    names = list(calls)
    samples = collections.defaultdict(list)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            samples[name].append(profiled_call(calls[name], count))
    result = {}
    for name, runs in samples.items():
        types = {t for run in runs for t in run["op_type_ms"]}
        per_type = {key: {t: statistics.median(run[key].get(t, 0.0) for run in runs) for t in types}
                    for key in ("op_type_ms", "op_type_events")}
        result[name] = {"events_per_round": [round(sum(run["op_type_events"].values()), 2) for run in runs],
                        "wall_ms": statistics.median(run["wall_ms"] for run in runs),
                        "op_ms": sum(per_type["op_type_ms"].values()),
                        "op_events": sum(per_type["op_type_events"].values()), **per_type}
    for name in names:
        if name != "bare_step":
            result[name]["beyond_floor"] = beyond_floor(result[name], result["bare_step"])
    return result


def beyond_floor(variant: dict, bare: dict) -> dict:
    """The op types a variant runs more often per step than the bare step, and what those extra events cost.

    Per type: the extra events per step and the extra op time per step (the
    variant's time for that type minus the bare step's).
    """
    extra = {t: {"events": n - bare["op_type_events"].get(t, 0.0),
                 "ms": variant["op_type_ms"][t] - bare["op_type_ms"].get(t, 0.0)}
             for t, n in variant["op_type_events"].items() if n - bare["op_type_events"].get(t, 0.0) >= 0.5}
    return {"op_types": extra, "events": sum(e["events"] for e in extra.values()),
            "ms": sum(e["ms"] for e in extra.values())}


def _print_profile(result: dict, rounds: int) -> None:
    names = list(result)
    print(f"\nprofiled: {rounds} calls of each variant, per step "
          "(ops overlap on the cores: op time can exceed wall time)")
    print(f"{'':<22}" + "".join(f"{name:>20}" for name in names))
    for label, key in (("wall ms", "wall_ms"), ("summed op ms", "op_ms"), ("op events", "op_events")):
        print(f"{label:<22}" + "".join(f"{result[n][key]:>20.2f}" for n in names))
    for name in names:
        counts = result[name]["events_per_round"]
        if max(counts) > 1.01 * min(counts):
            print(f"{name}: op events per step changed between rounds ({min(counts)}-{max(counts)}): "
                  "the tracer missed ops, and the figures below undercount them")
        extra = result[name].get("beyond_floor")
        if not extra:
            continue
        print(f"{name}: {extra['events']:.1f} op events per step beyond the bare step's, "
              f"{extra['ms']:.3f} ms of op time "
              f"({extra['ms'] / result[name]['wall_ms']:.1%} of its profiled wall time):")
        ranked = sorted(extra["op_types"].items(), key=lambda item: -item[1]["ms"])
        print("  " + ", ".join(f"{t} +{e['events']:.1f} ({e['ms']:+.3f} ms)" for t, e in ranked))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layout", choices=["none", "mirrored2"], default="none")
    parser.add_argument("--examples", type=int, default=12800)
    parser.add_argument("--rounds", type=int, default=40, help="timed calls per variant")
    parser.add_argument("--steps-per-call", type=int, default=32)
    parser.add_argument("--profile-rounds", type=int, default=0,
                        help="profiled calls per variant, before warm-up and the timed calls (0: no profile)")
    parser.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    args = parser.parse_args()
    if args.rounds < 3:
        parser.error(f"--rounds must be >= 3 for a median; got {args.rounds}")
    if args.profile_rounds < 0:
        parser.error(f"--profile-rounds must be >= 0; got {args.profile_rounds}")
    x, y, layouts = throughput.setup(args.examples)
    strategy = layouts[args.layout]
    import keras

    from fashion_mnist import build_model

    # The same layers, compiled without metrics. (Re-compiling a compiled model without `metrics`
    # keeps its metrics, as Keras does, and `clone_model` copies them too.)
    with_metrics = build_model()
    no_metrics = keras.Sequential.from_config(with_metrics.get_config())
    no_metrics.compile(optimizer=keras.optimizers.Adam(1e-3), loss=with_metrics.loss)
    calls = throughput.quietly(lambda: {
        "trainer": trainer_call(strategy, x, y, build_model()),
        "trainer_no_metrics": trainer_call(strategy, x, y, no_metrics),
        "bare_step": bare_call(strategy, x, y),
    })
    for call in calls.values():  # tracing
        call(args.steps_per_call)
    profiled = profile(calls, args.profile_rounds, args.steps_per_call) if args.profile_rounds else None
    for call in calls.values():  # warm up: first-call costs
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
    if profiled:
        results["profile"] = {"rounds": args.profile_rounds, "variants": profiled}
        _print_profile(profiled, args.profile_rounds)
    throughput.save(results, args.out)


if __name__ == "__main__":
    main()
