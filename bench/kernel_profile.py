"""How much of each variant's step time the model's own kernels take, from the TensorFlow profiler.

    python bench/kernel_profile.py [--examples 6400] [--rounds 5] [--out bench/results/kernel_profile.json]

The variants are bench/throughput.py's (bench/variants.py), with no strategy
and with MirroredStrategy over 2 logical CPU devices. Each round profiles one
epoch of every variant in turn with `tf.profiler` (host tracer; no Python
tracer, which would slow the Python-heavy variants most), then runs one
unprofiled epoch to show what the profiler itself cost.

From each trace it takes the **kernel time**: the wall time during which at
least one of the model's ops was running (convolutions, pooling, matmuls,
optimizer updates; every op except control flow, function calls, input and
cross-device ops). Its share of the profiled wall time says how much of a
variant's step the kernels fill. The bare step (the floor) should be nearly all
kernel time; if it is, no trainer that runs the same kernels, scheduled the
same way, can beat it. (tf.data functions that run on the op threads rather
than tf.data's own count as kernels: a variant's kernel time can include some
of its input work.)

The **ceiling** of a variant is its unprofiled wall time per step over the bare
step's kernel time in the same round (the median over rounds is reported): how far a trainer with no cost at all
besides the kernels could lead it on this machine. (The unprofiled time is
used because the profiler slows per-element tf.data pipelines most; it leaves
out the wait for a tf.data iterator's teardown at the end of an epoch, which is
not a cost per step, see bench/throughput.py.) Where the
ceiling is below a throughput target, the target is out of reach for reasons
outside the trainer.

The epochs are profiled after warm-up, when TensorFlow's executor (TF 2.21)
has found the cheap ops (a few thousand cycles a run) inexpensive and runs them
inline, and the host tracer no longer records most of them: Adam's per-variable
arithmetic, the loss's reductions, the metrics' updates. Kernel times leave
them out (traced before warm-up, the bare step's ops other than convolutions,
pooling, ReLU gradients and matmuls took about 1.0 ms of op time per 10.4 ms step:
bench/results/step_cost_profile_epyc_none.json), so the floor's
kernel time is a lower bound and the ceilings are upper bounds: a target above
a ceiling is out of reach all the more. bench/step_cost.py profiles before
warm-up to see every op.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import statistics
import tempfile
import time

from throughput import machine, one_malloc_state, quietly, setup, warm_up

HERE = os.path.dirname(os.path.abspath(__file__))

# A TensorFlow op's trace event is named "<op name>:<op type>"; op names hold no colons or spaces
# (runtime events such as "ExecutorState::Process" or "EagerLocalExecute: f" do).
_OP_EVENT = re.compile(r"^[^ :]+:([A-Za-z0-9_]+)$")
# Ops whose events span other ops or wait on something other than the model's arithmetic.
NOT_KERNELS = frozenset({
    "While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
    "PartitionedCall", "StatefulPartitionedCall", "RemoteCall",
    "IteratorGetNext", "IteratorGetNextAsOptional", "MultiDeviceIteratorGetNextFromShard",
    "EagerPyFunc", "PyFunc", "PyFuncStateless",
    "CollectiveReduceV2", "CollectiveReduceV3", "CollectiveGatherV2", "CollectiveAllToAllV2",
    "NcclAllReduce", "_Send", "_Recv", "_HostSend", "_HostRecv",
})


def host_op_events(xspace):
    """(op type, start ps, duration ps) of every op event on the host plane, input pipeline threads left out."""
    for plane in xspace.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name.startswith("tf_data"):  # input pipeline threads
                continue
            for event in line.events:
                match = _OP_EVENT.match(plane.event_metadata[event.metadata_id].name)
                if match is not None:
                    yield match.group(1), line.timestamp_ns * 1000 + event.offset_ps, event.duration_ps


def kernel_events(xspace) -> tuple[list[tuple[int, int]], collections.Counter]:
    """(start_ps, end_ps) of every kernel on the host plane, and the summed time per op type.

    The summed times include the excluded op types too, so that what they
    cost (a py-function's gather, an iterator read) can be reported.
    """
    intervals, per_type = [], collections.Counter()
    for op_type, start, duration in host_op_events(xspace):
        per_type[op_type] += duration
        if op_type not in NOT_KERNELS:
            intervals.append((start, start + duration))
    return intervals, per_type


def covered_ps(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of the intervals: time during which at least one ran."""
    total, end = 0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total, end = total + stop - start, stop
        elif stop > end:
            total, end = total + stop - end, stop
    return total


def read_trace(logdir: str):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    xspace = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        xspace.ParseFromString(f.read())
    return xspace


def traced(fn):
    """Runs `fn()` under the TensorFlow profiler (host tracer only); returns its result and the trace (an XSpace)."""
    import tensorflow as tf

    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0,
                                                       device_tracer_level=0)
    logdir = tempfile.mkdtemp(prefix="trace_")
    tf.profiler.experimental.start(logdir, options=options)
    try:
        result = fn()
    finally:
        tf.profiler.experimental.stop()
    try:
        return result, read_trace(logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)


def profile_epoch(runner, global_batch: int) -> dict:
    """One profiled epoch, then one plain epoch; per-step milliseconds."""
    def epoch():
        start = time.perf_counter()
        return quietly(runner.epoch), time.perf_counter() - start

    (examples, wall), xspace = traced(epoch)
    intervals, per_type = kernel_events(xspace)
    start = time.perf_counter()
    quietly(runner.epoch)
    # Left out: the wait for a tf.data iterator's teardown at the epoch's end (bench/throughput.py), not a step cost.
    plain = time.perf_counter() - start - (getattr(runner, "teardown_seconds", None) or 0.0)
    per_step = 1e3 * global_batch / examples  # seconds per epoch -> ms per step
    return {"wall_ms": wall * per_step, "kernel_ms": covered_ps(intervals) / 1e12 * per_step,
            "plain_wall_ms": plain * per_step,
            "op_type_ms": {t: ps / 1e12 * per_step for t, ps in per_type.items()}}


def _profile_layout(strategy, x, y, rounds: int) -> dict:
    import variants

    global_batch = variants.PER_REPLICA * strategy.num_replicas_in_sync
    runners, errors = warm_up({name: make(strategy, x, y) for name, make in variants.VARIANTS.items()})
    if "bare_step" not in runners:
        raise RuntimeError(f"the bare step, which the ceilings are measured against, failed: {errors['bare_step']}")
    mmap_threshold = one_malloc_state()
    profile_epoch(runners["bare_step"], global_batch)  # the first profiler session is slow
    names = list(runners)
    samples = collections.defaultdict(list)
    for i in range(rounds):
        # Each round starts one variant later, so no variant always follows the same one.
        this_round = {name: profile_epoch(runners[name], global_batch) for name in names[i:] + names[:i]}
        floor = this_round["bare_step"]["kernel_ms"]
        for name, r in this_round.items():
            samples[name].append({**r, "ceiling": r["plain_wall_ms"] / floor})
    result = {}
    for name in names:
        runs = samples[name]
        result[name] = {key: statistics.median(r[key] for r in runs)
                        for key in ("wall_ms", "kernel_ms", "plain_wall_ms", "ceiling")}
        # From the medians, so that the table's columns agree with each other.
        result[name]["kernel_share"] = result[name]["kernel_ms"] / result[name]["wall_ms"]
        op_ms = {t: statistics.median(r["op_type_ms"].get(t, 0.0) for r in runs)
                 for t in {t for r in runs for t in r["op_type_ms"]}}
        kernels = sorted((t for t in op_ms if t not in NOT_KERNELS), key=lambda t: -op_ms[t])
        result[name]["op_type_ms"] = {t: op_ms[t] for t in kernels[:8]}
        result[name]["excluded_op_type_ms"] = {t: ms for t, ms in op_ms.items() if t in NOT_KERNELS and ms >= 0.01}
    return {"variants": result, "errors": errors, "rounds": rounds, "mmap_threshold": mmap_threshold}


def _print_table(layout: str, result: dict) -> None:
    print(f"\n== {layout}")
    print(f"{'variant':<19} {'profiled':>9} {'kernels':>8} {'share':>6} {'unprofiled':>11} {'ceiling':>8}")
    print(f"{'':<19} {'ms/step':>9} {'ms/step':>8} {'':>6} {'ms/step':>11}")
    for name, r in result["variants"].items():
        print(f"{name:<19} {r['wall_ms']:>9.2f} {r['kernel_ms']:>8.2f} {r['kernel_share']:>6.0%} "
              f"{r['plain_wall_ms']:>11.2f} {r['ceiling']:>7.2f}x")
    for name, error in result["errors"].items():
        print(f"{name:<19} failed: {error}")
    top = result["variants"]["bare_step"]["op_type_ms"]  # _profile_layout requires the bare step
    print("bare step, summed op time per step (ops overlap on the two cores): "
          + ", ".join(f"{t} {ms:.1f} ms" for t, ms in top.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=6400)
    parser.add_argument("--rounds", type=int, default=5, help="profiled epochs per variant (median reported)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "kernel_profile.json"))
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1; got {args.rounds}")
    x, y, layouts = setup(args.examples)
    results = {"machine": machine(), "examples": args.examples, "layouts": {}}
    for layout, strategy in layouts.items():
        results["layouts"][layout] = _profile_layout(strategy, x, y, args.rounds)
        _print_table(layout, results["layouts"][layout])
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
