"""Training throughput, side by side in one run: the Trainer against what a user would pick instead.

    python bench/throughput.py [--examples 12800] [--repeats 3] [--out bench/results/throughput.json]

The model is the Fashion-MNIST example's CNN on generated 28x28x1 images, 64
examples per replica, Adam. Five ways to train it, each with no strategy and
with MirroredStrategy over 2 logical CPU devices:

  trainer         Trainer.fit with its defaults (progress bar and plan included)
  trainer_dataset the same, fed a tf.data dataset of the same examples
  keras_default   keras Model.fit with Keras's defaults (jit_compile="auto")
  keras_tuned     keras Model.fit, jit_compile=False, steps_per_execution=32
  bare_step       forward + backward + apply, 32 steps per tf.function call, on
                  batches already in memory on each replica's device: no input
                  pipeline, no metrics, no callbacks. The floor.
  bare_step_pipeline  the same step fed by the Trainer's input path for
                  arrays, its ArrayFeed (what feeding costs, and what the
                  Trainer adds to it)
  tutorial        the custom loop of the distributed custom-training guide
                  (from_tensor_slices + shuffle + batch, one step per call)

Every variant first runs one untimed epoch (tracing, warm-up); then the timed
epochs are interleaved (one epoch of each variant in turn, `--repeats` rounds)
and the median is reported, with the Trainer's ratio to each variant taken
round by round (median over rounds), so slow drifts of a shared machine hit
all variants alike. Ratios from one run are comparable; absolute figures vary with
the machine and its load. A variant that fails (Keras under MirroredStrategy
with steps_per_execution > 1) is reported with its error.

Keras's fit and the tutorial read a tf.data iterator, which they destroy at the
end of each epoch; on TensorFlow 2.21 that can wait 1-2 s for tf.data's
autotuner (see bench/README.md). Their epochs are timed with the wait, as a user
meets it, and the wait is also reported on its own, with the Trainer's ratios
recomputed without it.

Also reported: the Trainer's time outside its step calls (callbacks, logging,
set-up, iterator creation) as a share of each fit, a sweep of
steps_per_execution, and, from a fresh process (bench/memory.py), the peak RSS
growth of a fit on NumPy arrays relative to the arrays' size.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, TypeVar

T = TypeVar("T")

HERE = os.path.dirname(os.path.abspath(__file__))


def setup(examples: int) -> tuple:
    """(x, y, layouts): `examples` generated images, and no strategy / MirroredStrategy over 2 CPUs.

    Splits the CPU into 2 logical devices first, so call it before TensorFlow
    initialises its devices.
    """
    split_cpu(2)
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import tensorflow as tf

    from fashion_mnist import prepare, synthetic_images

    x, y = prepare(*synthetic_images(examples))
    return x, y, {"none": tf.distribute.get_strategy(),
                  "mirrored2": tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])}


def run_layouts(description: str, runners: Callable, report: Callable[[str, dict], None]) -> None:
    """The side-by-side benches' main: `--examples/--repeats/--out`, then each layout measured and reported.

    `runners(strategy, x, y)` makes the variants; `report(layout, measured)`
    prints (and may add to) what `measure` returned for a layout.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--examples", type=int, default=12800)
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per variant (median reported)")
    parser.add_argument("--out", default=None, help="JSON file to write (default: print only)")
    parser.add_argument("--layouts", nargs="*", default=None, help="only these layouts (default: all)")
    args = parser.parse_args()
    if args.repeats < 3:
        parser.error(f"--repeats must be >= 3 for a median; got {args.repeats}")
    x, y, layouts = setup(args.examples)
    results = {"machine": machine(), "examples": args.examples, "layouts": {}}
    for layout, strategy in layouts.items():
        if args.layouts is not None and layout not in args.layouts:
            continue
        measured = measure(quietly(lambda: runners(strategy, x, y)), args.repeats)
        results["layouts"][layout] = measured
        print(f"{layout}: examples/s " + ", ".join(f"{k} {v:.0f}" for k, v in measured["examples_per_s"].items()))
        report(layout, measured)
        if measured["errors"]:
            print(f"{layout}: failed: {measured['errors']}")
    save(results, args.out)


def split_cpu(n: int) -> None:
    """Makes the CPU `n` logical devices; call before TensorFlow initialises its devices."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=12800)
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs per variant (median reported)")
    parser.add_argument("--sweep", type=int, nargs="*", default=[1, 4, 16, 64],
                        help="fixed steps_per_execution values to compare with 'auto'")
    parser.add_argument("--memory-examples", type=int, default=60000, help="0 skips the memory probe")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "throughput.json"))
    args = parser.parse_args()
    if args.repeats < 3:
        parser.error(f"--repeats must be >= 3 for a median; got {args.repeats}")
    x, y, layouts = setup(args.examples)
    import variants

    results = {"machine": machine(), "examples": args.examples, "per_replica_batch": variants.PER_REPLICA,
               "repeats": args.repeats, "layouts": {}}
    for layout, strategy in layouts.items():
        print(f"\n== {layout}: {strategy.num_replicas_in_sync} replica(s)", flush=True)
        runners = {name: make(strategy, x, y) for name, make in variants.VARIANTS.items()}
        for name, spe in [(f"trainer_spe{n}", n) for n in args.sweep]:
            runners[name] = variants.trainer(strategy, x, y, steps_per_execution=spe)
        results["layouts"][layout] = measure(runners, args.repeats)
        for key, dataset in (("epoch_overhead_share", False), ("epoch_overhead_share_dataset", True)):
            overhead = quietly(lambda: variants.epoch_overhead(strategy, x, y, args.repeats + 1, dataset=dataset))
            results["layouts"][layout][key] = statistics.median(overhead)
        _print_table(layout, results["layouts"][layout])
    if args.memory_examples:
        results["memory"] = _memory_probe(args.memory_examples)
        m = results["memory"]
        print(f"\nNumPy input, {m['examples']} examples ({m['array_mb']:.0f} MB of arrays): peak RSS growth "
              f"first fit {m['first_fit_growth_mb']:.0f} MB = {m['first_fit_ratio']:.2f}x, second fit "
              f"{m['second_fit_growth_mb']:.0f} MB = {m['second_fit_ratio']:.2f}x the arrays")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"\nwrote {args.out}")


def warm_up(runners: dict) -> tuple[dict, dict]:
    """One untimed epoch of each runner: (the runners that worked, {name: error} of those that failed)."""
    working, errors = {}, {}
    for name, runner in runners.items():
        try:
            quietly(runner.epoch)
            working[name] = runner
        except Exception as err:  # reported, not fatal: Keras fails under some layouts
            errors[name] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:160]}"
    return working, errors


def one_malloc_state() -> dict:
    """Raises glibc's mmap threshold, so that every timed epoch after warm-up runs with the same one.

    Reading a tf.data iterator in warm-up may have made TensorFlow pin it for
    the whole process (trainer/engine/malloc.py); the Trainer raises it only after its
    own such step calls, so otherwise the state would depend on which variant
    ran first.
    """
    from trainer.engine import malloc

    return {"raised_by_trainer_in_warm_up": malloc.raised(), "raised_by_bench": malloc.raise_threshold()}


def measure(runners: dict, repeats: int) -> dict:
    """Warm-up epoch each, then `repeats` interleaved timed rounds; medians per variant."""
    working, errors = warm_up(runners)
    state = one_malloc_state()
    times: dict[str, list] = {name: [] for name in working}
    untorn: dict[str, list] = {name: [] for name in working}  # examples/s with the iterator teardown left out
    teardowns: dict[str, list] = {}
    overheads: dict[str, list] = {}
    for _ in range(repeats):
        for name in times:
            runner = runners[name]
            start = time.perf_counter()
            examples = quietly(runner.epoch)
            seconds = time.perf_counter() - start
            times[name].append(examples / seconds)
            teardown = getattr(runner, "teardown_seconds", None)
            untorn[name].append(examples / (seconds - (teardown or 0.0)))
            if teardown is not None:
                teardowns.setdefault(name, []).append(teardown)
            if getattr(runner, "step_seconds", None) is not None:
                overheads.setdefault(name, []).append(1 - runner.step_seconds / seconds)
    return {
        "examples_per_s": {name: statistics.median(r) for name, r in times.items()},
        "all_examples_per_s": times,
        "errors": errors,
        "overhead_share": {name: statistics.median(v) for name, v in overheads.items()},
        # Seconds per epoch that Keras's fit and the tutorial waited for their tf.data iterator
        # to be destroyed (TensorFlow's autotuner; see bench/README.md), every round.
        "teardown_seconds": teardowns,
        "trainer_ratio": _ratios(times),
        "trainer_ratio_without_teardown": _ratios(untorn),
        "repeats": repeats,
        "mmap_threshold": state,
    }


def _ratios(rates: dict[str, list]) -> dict[str, float]:
    """Trainer / each variant, round by round, median over rounds.

    Each round's epochs ran back to back, so a round's ratio is less exposed to a
    shared machine's drifts than the ratio of medians.
    """
    if "trainer" not in rates:
        return {}
    return {name: statistics.median(t / v for t, v in zip(rates["trainer"], r)) for name, r in rates.items()}


def save(results: dict, path: str | None) -> None:
    """Writes `results` as JSON to `path` (nothing when None) and says so."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {path}")


def quietly(fn: Callable[[], T]) -> T:
    """Calls `fn` with stdout and stderr swallowed (Keras's progress bars, TF's logs)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return fn()


def _print_table(layout: str, result: dict) -> None:
    print(f"{'variant':<19} {'examples/s':>11} {'Trainer / it':>13} {'teardown left out':>18} "
          f"{'outside steps (per fit)':>24}")
    print(f"{'':<19} {'(median)':>11} {'(per round)':>13} {'(s per epoch)':>18}")
    for name, rate in result["examples_per_s"].items():
        overhead = result["overhead_share"].get(name)
        teardown = result["teardown_seconds"].get(name)
        untorn = "" if teardown is None else (f"{result['trainer_ratio_without_teardown'][name]:.2f}x "
                                              f"({min(teardown):.2f}-{max(teardown):.2f})")
        print(f"{name:<19} {rate:>11,.0f} {result['trainer_ratio'].get(name, float('nan')):>12.2f}x {untorn:>18} "
              f"{'' if overhead is None else f'{overhead:>13.1%}'}")
    for name, error in result["errors"].items():
        print(f"{name:<19} {'failed':>11}   {error}")
    print(f"Trainer, one multi-epoch fit: {result['epoch_overhead_share']:.1%} of each epoch outside step calls "
          f"(arrays), {result['epoch_overhead_share_dataset']:.1%} (dataset)")
    mmap = result["mmap_threshold"]
    print(f"glibc mmap threshold (trainer/engine/malloc.py): raised by the Trainer in warm-up: "
          f"{mmap['raised_by_trainer_in_warm_up']}; "
          f"by the benchmark before the timed rounds: {mmap['raised_by_bench']}")


def _memory_probe(examples: int) -> dict:
    out = subprocess.run([sys.executable, os.path.join(HERE, "memory.py"), "--examples", str(examples)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def machine() -> dict:
    """What the figures were measured on, including whether TensorFlow's oneDNN kernels were on."""
    import keras
    import tensorflow as tf

    from trainer._compat import onednn_enabled
    from trainer.engine.engine import cpu_flags

    cpuinfo = open("/proc/cpuinfo").read().splitlines() if os.path.exists("/proc/cpuinfo") else []
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                 platform.processor())
    return {"date": time.strftime("%Y-%m-%d"), "cpu": model, "cores": os.cpu_count(),
            # The CPU features that decide TensorFlow's oneDNN default and native bfloat16,
            # and what this process got.
            "cpu_flags": sorted(cpu_flags() & {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni",
                                               "amx_tile", "amx_bf16"}),
            "onednn": onednn_enabled(),
            "tensorflow": tf.__version__, "keras": keras.__version__, "python": platform.python_version()}


if __name__ == "__main__":
    main()
