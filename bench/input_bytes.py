"""Bytes each worker reads in one epoch, per input form, on W = 1, 2 and 4 local workers.

Usage: python bench/input_bytes.py [--workers 1,2,4] [--out bench/results/input_bytes.json]

Every form holds the same 32 MiB: 8192 examples of 1024 float32 features (4 KiB, one page each), trained for
one epoch of 128 steps of 64 under `trainer-launch --workers W` (one replica per worker). Each worker measures what
its own process read of the data in a steady epoch (the second of two; the memmap's one epoch):

- memmap: `np.memmap` arrays (the arrays' gather path). Each worker maps its own copy of the file, written back
  and evicted from the page cache first (fsync, posix_fadvise DONTNEED) and mapped with MADV_RANDOM (no
  read-ahead), so the pages resident after the fit (mincore) are the pages its process read. Also through the
  pipeline that GPUs and TPUs read arrays through (TRAINER_ACCELERATOR_READER=1).
- PyDataset: the bytes its `__getitem__` returned in the process; a Grain MapDataset of a random-access
  source, batched: the bytes the source returned.
- TFRecord: the bytes the process read from files during the fit (/proc/self/io rchar), with the default
  data_sharding="exact" and with Trainer(data_sharding="files", file_shards=4).

The goal (issue 60): at most 1.1 / W of the data per worker for forms read by record. The last loss shows
whether W changes the numbers. Prints a Markdown table; writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import subprocess
import sys
import tempfile

ROWS, FEATURES, BATCH, FILES = 8192, 1024, 64, 16
FORMS = ("memmap", "memmap, accelerator reader", "PyDataset", "TFRecord", "TFRecord, data_sharding='files'",
         "grain MapDataset")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--forms", default=",".join(map(str, range(len(FORMS)))),
                        help="the forms to run, by their index in FORMS (0-5)")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "input_bytes.json"))
    parser.add_argument("--worker", choices=FORMS, help=argparse.SUPPRESS)  # one task's run, under trainer-launch
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.data)
    counts = [int(w) for w in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as data:
        write_data(data, max(counts))
        for form in [FORMS[int(i)] for i in args.forms.split(",")]:
            for workers in counts:
                rows.append(run(form, workers, data))
                print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump({"rows": rows, "data_bytes": ROWS * FEATURES * 4}, f, indent=1)
    print(table(rows))


def write_data(folder: str, copies: int) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    y = (x[:, :8].sum(axis=1) > 0).astype("float32")
    np.save(os.path.join(folder, "y.npy"), y)
    for copy in range(copies):  # one copy per worker: each process's reads are its own pages
        x.tofile(os.path.join(folder, f"x-{copy}.bin"))
    per_file = ROWS // FILES
    for f in range(FILES):
        with tf.io.TFRecordWriter(os.path.join(folder, f"part-{f:03d}.tfrecord")) as writer:
            for row in range(f * per_file, (f + 1) * per_file):
                feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x[row])),
                           "y": tf.train.Feature(float_list=tf.train.FloatList(value=[y[row]]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())


def run(form: str, workers: int, data: str) -> dict:
    out = os.path.join(data, "result")
    for name in os.listdir(data):
        if name.startswith("result-"):
            os.remove(os.path.join(data, name))
    command = [sys.executable, "-m", "trainer.launch", "--workers", str(workers), os.path.abspath(__file__),
               "--worker", form, "--data", data]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if "accelerator" in form:  # the pipeline GPUs and TPUs read arrays through, forced on CPU devices
        env["TRAINER_ACCELERATOR_READER"] = "1"
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise SystemExit(f"{form} on {workers} worker(s) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    tasks = []
    for task in range(workers):
        with open(f"{out}-{task}.json") as f:
            tasks.append(json.load(f))
    total = ROWS * FEATURES * 4
    return {"form": form, "workers": workers, "read_per_worker": [t["read"] / total for t in tasks],
            "loss": tasks[0]["loss"]}


def worker(form: str, data: str) -> None:
    import numpy as np

    from trainer import Trainer, cluster_info

    task = cluster_info().task_id
    files = form.startswith("TFRecord") and "files" in form
    trainer = Trainer(strategy="multi_worker", batch_size=BATCH, lr_scaling=None, seed=0, shuffle=True, verbose=0,
                      data_sharding="files" if files else "exact", file_shards=4)
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    y = np.load(os.path.join(data, "y.npy"))
    fit = {"epochs": 1}
    SecondEpoch = second_epoch_class()  # noqa: N806 (a class made once keras is imported)
    if form.startswith("memmap"):
        path = os.path.join(data, f"x-{task}.bin")
        with open(path, "rb") as f:  # written back first: the page cache keeps dirty pages
            os.fsync(f.fileno())
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        x = np.memmap(path, dtype="float32", mode="r", shape=(ROWS, FEATURES))
        x._mmap.madvise(mmap.MADV_RANDOM)
        history = trainer.fit(model, x, y, **fit)
        read = resident_bytes(x)
    elif form == "PyDataset":
        x = np.fromfile(os.path.join(data, "x-0.bin"), dtype="float32").reshape(ROWS, FEATURES)
        batches = counting_batches_class()(x, y)
        second = SecondEpoch(lambda: batches.bytes)
        history = trainer.fit(model, batches, shuffle=False, epochs=2, callbacks=[second])
        read = second.read
    elif form == "grain MapDataset":
        import grain

        x = np.fromfile(os.path.join(data, "x-0.bin"), dtype="float32").reshape(ROWS, FEATURES)
        source = counting_source_class()(x, y)
        second = SecondEpoch(lambda: source.bytes)
        history = trainer.fit(model, grain.MapDataset.source(source).batch(BATCH), epochs=2, callbacks=[second])
        read = second.read
    else:
        names = sorted(os.path.join(data, n) for n in os.listdir(data) if n.endswith(".tfrecord"))
        spec = {"x": tf.io.FixedLenFeature([FEATURES], tf.float32), "y": tf.io.FixedLenFeature([1], tf.float32)}

        def parse(record):
            example = tf.io.parse_single_example(record, spec)
            return example["x"], example["y"]

        dataset = tf.data.TFRecordDataset(names).map(parse).batch(BATCH)
        second = SecondEpoch(rchar)
        history = trainer.fit(model, dataset, steps_per_epoch=ROWS // BATCH if files else None, epochs=2,
                              callbacks=[second])
        read = second.read
    with open(os.path.join(data, f"result-{task}.json"), "w") as f:
        json.dump({"read": read, "loss": history.history["loss"][-1]}, f)


def second_epoch_class():
    import keras

    class SecondEpoch(keras.callbacks.Callback):
        """What `counter` counts during the second epoch: a steady epoch's reading, with read-ahead into the next
        one as into this one, and none of the first's one-off reads (Keras's peek at a PyDataset, a file shard's
        check)."""

        def __init__(self, counter):
            super().__init__()
            self.counter, self.read = counter, None

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                self.start = self.counter()

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                self.read = self.counter() - self.start

    return SecondEpoch


def resident_bytes(array) -> int:
    """Bytes of the array's mapping resident in the page cache (mincore), the pages its process read."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    page = mmap.PAGESIZE
    pages = -(-array.nbytes // page)
    vector = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(array.ctypes.data), ctypes.c_size_t(array.nbytes), vector):
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(byte & 1 for byte in vector) * page


def rchar() -> int:
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["rchar"])


def counting_batches_class():
    import keras

    class CountingBatches(keras.utils.PyDataset):
        """Batches of the arrays; counts the bytes it hands out in this process."""

        def __init__(self, x, y):
            super().__init__()
            self.x, self.y, self.bytes = x, y, 0

        def __len__(self):
            return ROWS // BATCH

        def __getitem__(self, i):
            rows = slice(i * BATCH, (i + 1) * BATCH)
            self.bytes += self.x[rows].nbytes
            return self.x[rows], self.y[rows]

    return CountingBatches


def counting_source_class():
    class CountingSource:
        """A random-access source of (features, target) records, as Grain reads one; counts the bytes it hands
        out in this process."""

        def __init__(self, x, y):
            self.x, self.y, self.bytes = x, y, 0

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            self.bytes += self.x[i].nbytes
            return self.x[i], self.y[i]

    return CountingSource


def table(rows: list[dict]) -> str:
    lines = ["| form | W | read per worker (of the data) | goal 1.1/W | last loss |", "|---|---|---|---|---|"]
    for row in rows:
        shares = ", ".join(f"{share:.3f}" for share in row["read_per_worker"])
        met = "met" if max(row["read_per_worker"]) <= 1.1 / row["workers"] else "not met"
        lines.append(f"| {row['form']} | {row['workers']} | {shares} | {met} | {row['loss']:.6f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
