"""What a backup of a reshuffling tf.data pipeline costs: the mark's bytes and write time against buffer size.

A fit that BackupAndRestore resumes marks its tf.data reader's place (trainer/data/marks.py): at a pass's
start (the shuffle's seeds; its buffer still empty) or, in a stream cut by steps_per_epoch and read in the
step, at each epoch's start (the shuffle and prefetch buffers as they are). The mark goes to a file of its
own the first time a backup holds it, once a pass or an epoch; each backup itself writes the weights, as
before. This measures, side by side in one run, for shuffle buffers of N examples of 28x28 float32:

  mark bytes / mark ms   taking the mark (SerializeIterator) and its size
  file ms                writing the mark's file (np.savez, fsync, rename), once a pass or an epoch
  backup ms              writing the weights' backup.npz of the example's CNN, every backup (no mark in it)
  resume ms              putting the mark back into a fresh iterator and reading on 10 global batches of 64

Usage: python bench/backup_state.py [--sizes 1000 10000 60000] [--repeats 5] [--out bench/results/backup_state.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer.callbacks._cluster import replace_atomically  # noqa: E402
from trainer.data import marks  # noqa: E402
from trainer.data.marks import Place  # noqa: E402


def _best_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def _write(directory: str, name: str, arrays: dict) -> int:
    path = os.path.join(directory, name)
    replace_atomically(lambda tmp: np.savez(tmp, **arrays), path, suffix=".npz")
    return os.path.getsize(path)


def _cnn_weights() -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    from fashion_mnist import build_model  # the example's CNN

    model = build_model()
    return {f"model_{i}": np.asarray(w) for i, w in enumerate(model.get_weights())}


def measure(size: int, repeats: int, directory: str, weights: dict) -> list[dict]:
    x = np.random.default_rng(0).random((size, 28, 28), dtype=np.float32)
    examples = tf.data.Dataset.from_tensor_slices(x)
    pipelines = {
        "pass start": examples.shuffle(size, seed=1).batch(64).prefetch(2),
        "stream epoch start": examples.shuffle(size, seed=1).repeat().batch(64).prefetch(2),
    }
    rows = []
    for where, batches in pipelines.items():
        iterator, mark = marks.iterator_at(batches, Place(0, 0))
        if where == "stream epoch start":  # read into the stream, as at a later epoch's start
            for _ in range(20):
                next(iterator)
            mark = marks.mark_here(iterator, 0, 20)
        taking = _best_ms(lambda: marks.mark_here(iterator, 0, mark.step), repeats)
        states = {f"state_{i}": np.frombuffer(s, np.uint8) for i, s in enumerate(mark.states)}
        file_ms = _best_ms(lambda: _write(directory, "reader.npz", states), repeats)
        backup_ms = _best_ms(lambda: _write(directory, "backup.npz", weights), repeats)
        resume_ms = _best_ms(lambda: marks.iterator_at(batches, Place(0, mark.step + 10, mark)), repeats)
        rows.append({"buffer_examples": size, "buffer_mb": round(x.nbytes / 1e6, 1), "mark": where,
                     "mark_bytes": mark.nbytes, "mark_ms": round(taking, 1), "file_ms": round(file_ms, 1),
                     "backup_bytes": os.path.getsize(os.path.join(directory, "backup.npz")),
                     "backup_ms": round(backup_ms, 1), "resume_ms": round(resume_ms, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 60000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    weights = _cnn_weights()
    with tempfile.TemporaryDirectory() as directory:
        rows = [row for size in args.sizes for row in measure(size, args.repeats, directory, weights)]
    if args.out:
        record = {"tensorflow": tf.__version__, "cpu_count": os.cpu_count(), "rows": rows}
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
