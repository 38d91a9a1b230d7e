"""Peak RSS growth of Trainer.fit on NumPy arrays, relative to the arrays' size.

    python bench/memory.py [--examples 60000]

Run in a fresh process (bench/throughput.py does). TensorFlow is initialised
and the model built before the arrays are measured; then the kernel's peak-RSS
counter is reset (/proc/self/clear_refs) and one fit runs. The first fit also
traces the step functions; the second shows the steady state. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _peak_growth_mb(fn) -> float:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    before = _status_kb("VmRSS")
    fn()
    return (_status_kb("VmHWM") - before) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=60000)
    args = parser.parse_args()
    from fashion_mnist import build_model, prepare, synthetic_images
    from trainer import Trainer

    x, y = prepare(*synthetic_images(args.examples))
    trainer = Trainer(strategy="default", per_replica_batch_size=64, verbose=0)
    model = build_model()
    model(x[:2])
    array_mb = (x.nbytes + y.nbytes) / 2**20
    first = _peak_growth_mb(lambda: trainer.fit(model, (x, y), epochs=1))
    second = _peak_growth_mb(lambda: trainer.fit(model, (x, y), epochs=1))
    print(json.dumps({
        "examples": args.examples, "array_mb": array_mb,
        "first_fit_growth_mb": first, "first_fit_ratio": first / array_mb,
        "second_fit_growth_mb": second, "second_fit_ratio": second / array_mb,
    }))


if __name__ == "__main__":
    main()
