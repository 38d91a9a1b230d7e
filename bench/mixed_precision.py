"""Opt-in mixed precision on this CPU: the Trainer in float32 against `mixed_bfloat16`, side by side.

    python bench/mixed_precision.py [--examples 12800] [--repeats 5] [--out bench/results/mixed_precision.json]

The model, data and timing are bench/throughput.py's: the example's CNN on
generated images, 64 per replica, with no strategy and with MirroredStrategy
over 2 logical CPUs; one untimed epoch each, then interleaved rounds of one
`fit(epochs=1)` per variant, medians. The bfloat16 speed-up is taken round by
round. It measures speed only: the generated images are too easy to tell the
two apart (both reach 100%), so accuracy is compared on the real Fashion-MNIST
test set with `examples/fashion_mnist.py --mixed-precision mixed_bfloat16`
(the README's example section; bench/README.md).

Whether bfloat16 pays depends on the CPU: oneDNN runs bfloat16 convolutions
and matmuls natively on CPUs with AVX512_BF16 or AMX (the JSON records the
CPU's flags and whether oneDNN was on), and emulates them elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import throughput

HERE = os.path.dirname(os.path.abspath(__file__))
POLICIES = {"trainer": None, "trainer_bf16": "mixed_bfloat16"}  # "trainer" is the float32 reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=12800)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (median reported)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "mixed_precision.json"))
    args = parser.parse_args()
    if args.repeats < 3:
        parser.error(f"--repeats must be >= 3 for a median; got {args.repeats}")
    x, y, layouts = throughput.setup(args.examples)
    import variants

    results = {"machine": throughput.machine(), "examples": args.examples, "repeats": args.repeats, "layouts": {}}
    for layout, strategy in layouts.items():
        runners = {name: variants.trainer(strategy, x, y, mixed_precision=policy) for name, policy in POLICIES.items()}
        measured = throughput.measure(runners, args.repeats)
        rates = measured["all_examples_per_s"]
        if measured["errors"]:
            print(f"{layout}: failed: {measured['errors']}")
            results["layouts"][layout] = {"errors": measured["errors"]}
            continue
        speedup = statistics.median(b / f for f, b in zip(rates["trainer"], rates["trainer_bf16"]))
        results["layouts"][layout] = {"examples_per_s": measured["examples_per_s"], "all_examples_per_s": rates,
                                      "bf16_speedup": speedup}
        print(f"{layout}: float32 {measured['examples_per_s']['trainer']:,.0f} ex/s, mixed_bfloat16 "
              f"{measured['examples_per_s']['trainer_bf16']:,.0f} ex/s, bfloat16 / float32 {speedup:.2f}x (per round)")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
