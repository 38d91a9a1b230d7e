"""Trains on TFRecord files with Trainer(data_sharding="files") in one device layout; saves what each task got.

Usage: python file_shards_run.py DATA_DIR OUT_DIR [--replicas N] [--write]

`--write`: writes the files (16 TFRecord files of 30 examples of 16 KiB) to DATA_DIR and exits. Otherwise reads
them as a user's pipeline does (TFRecordDataset, parse, batch), in a strategy of N CPU replicas per process (the
multi-worker strategy under TF_CONFIG, as trainer-launch sets it), with 8 file shards, a global batch of 48 and
steps_per_epoch=7 for 2 epochs. Each task writes OUT_DIR/<task>.json (history, evaluate on the training files,
the optimizer's steps, the bytes its process read from the files) and OUT_DIR/<task>.npz (weights, predictions).
"""

import json
import os

import numpy as np
import tensorflow as tf

from start import REPLICAS, WRITE, arguments, start

args = arguments(__doc__, ("data", str), ("out", str, "?"), options=(REPLICAS, WRITE))
FILES, PER_FILE = 16, 30
BLOB = bytes(16384)  # 16 KiB a record that the model never reads, so that the files' bytes dwarf the rest
if args.write:
    rng = np.random.default_rng(0)
    for f in range(FILES):
        with tf.io.TFRecordWriter(os.path.join(args.data, f"part-{f:03d}.tfrecord")) as writer:
            for _ in range(PER_FILE):
                x = rng.normal(size=6).astype("float32")
                feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                           "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x[0] + x[1] > 0)])),
                           "blob": tf.train.Feature(bytes_list=tf.train.BytesList(value=[BLOB]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    raise SystemExit(0)
start(cpus=args.replicas if args.replicas > 1 else 0)

from trainer import Trainer, cluster_info  # noqa: E402

trainer = Trainer(strategy="multi_worker" if "TF_CONFIG" in os.environ else "mirrored", data_sharding="files",
                  file_shards=8, seed=0, verbose=1)

import keras  # noqa: E402

FEATURES = {"x": tf.io.FixedLenFeature([6], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
files = sorted(os.path.join(args.data, name) for name in os.listdir(args.data) if name.endswith(".tfrecord"))


def parse(record):
    example = tf.io.parse_single_example(record, FEATURES)
    return example["x"], example["y"]


def read_bytes() -> int:
    """Bytes this process has read through read() and its kin (/proc/self/io's rchar)."""
    with open("/proc/self/io") as f:
        return int(dict(line.split(": ") for line in f.read().splitlines())["rchar"])


keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
model.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])
dataset = tf.data.TFRecordDataset(files).map(parse).batch(48)
before = read_bytes()
history = trainer.fit(model, dataset, epochs=2, steps_per_epoch=7)
read = read_bytes() - before
evaluation = model.evaluate(tf.data.TFRecordDataset(files).map(parse).batch(48), verbose=0, return_dict=True)
info = cluster_info()
task = f"{info.task_type or 'single'}{info.task_id}"
with open(os.path.join(args.out, f"{task}.json"), "w") as f:
    json.dump({"history": history.history, "evaluate": evaluation, "read_bytes": read,
               "file_bytes": sum(os.path.getsize(name) for name in files),
               "iterations": int(model.optimizer.iterations.numpy())}, f)
x = np.stack([x for x, _ in tf.data.TFRecordDataset(files).map(parse).as_numpy_iterator()])
np.savez(os.path.join(args.out, f"{task}.npz"), weights=np.concatenate([w.ravel() for w in model.get_weights()]),
         predictions=model.predict(x, verbose=0))
print(json.dumps({"task": task}))
