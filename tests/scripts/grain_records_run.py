"""Grain MapDatasets over a random-access source, trained in one device layout; saves what each gave.

Usage: python grain_records_run.py OUT_DIR [--replicas N] [--reference]

`--reference`: `model.fit`, `evaluate` and `predict` on one device, given the grain datasets themselves (Keras's
own grain adapter). Otherwise, in a strategy of N CPU replicas (a MultiWorkerMirroredStrategy under TF_CONFIG, as
trainer-launch sets it), the same calls through the trainer. Each form is 100 records in batches of 24 (a last
batch of 4):

- records: a per-record map and sample weights, batched by `.batch(24)`: read record by record;
- shuffled: grain's seeded shuffle before `.batch(24)`: read record by record;
- batch_fn: `.batch(24, batch_fn=...)`, whose batches only the user's function makes: read whole.

The source counts the records it hands out in this process; the records read in each epoch after the first are
saved with the results. Each task writes OUT_DIR/<task>.json and OUT_DIR/<task>.npz.
"""

import json
import os
import threading

import numpy as np

from start import REFERENCE, REPLICAS, arguments, start, user_strategy

args = arguments(__doc__, ("out", str), options=(REPLICAS, REFERENCE))
start(cpus=args.replicas if args.replicas > 1 else 0)
strategy = user_strategy(args.replicas, reference=args.reference)

import grain  # noqa: E402
import keras  # noqa: E402

from trainer import Trainer, cluster_info  # noqa: E402

BATCH, EPOCHS = 24, 3
rng = np.random.default_rng(0)
x = rng.normal(size=(100, 6)).astype("float32")
y = (x[:, 0] + x[:, 1] > 0).astype("int64")
w = rng.uniform(0.5, 1.5, size=100).astype("float32")


class Records:
    """A random-access source of (features, label, weight) records, as grain reads one; counts what it hands out."""

    def __init__(self):
        self.read, self._lock = 0, threading.Lock()

    def __len__(self):
        return len(y)

    def __getitem__(self, index):
        with self._lock:
            self.read += 1
        return x[index], y[index], w[index]


def stack(records):
    return tuple(np.stack(parts) for parts in zip(*records))


FORMS = {
    "records": lambda source: grain.MapDataset.source(source).map(lambda r: (r[0] * 2.0, r[1], r[2])).batch(BATCH),
    "shuffled": lambda source: grain.MapDataset.source(source).shuffle(seed=3).map(lambda r: r[:2]).batch(BATCH),
    "batch_fn": lambda source: grain.MapDataset.source(source).batch(BATCH, batch_fn=stack),
}


class ReadPerEpoch(keras.callbacks.Callback):
    """The records the source handed out in each epoch."""

    def __init__(self, source):
        super().__init__()
        self.source, self.seen, self.per_epoch = source, 0, []

    def on_epoch_begin(self, epoch, logs=None):
        self.seen = self.source.read

    def on_epoch_end(self, epoch, logs=None):
        self.per_epoch.append(self.source.read - self.seen)


def model() -> keras.Model:
    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    built.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], weighted_metrics=["accuracy"])
    return built


trainer = None if args.reference else Trainer(strategy=strategy, seed=0, verbose=2)  # plans, a line an epoch
results, arrays = {}, {}
for form, make in FORMS.items():
    source = Records()
    fitted, reads = model(), ReadPerEpoch(source)
    if trainer is None:
        history = fitted.fit(make(source), epochs=EPOCHS, verbose=0, callbacks=[reads])
        evaluation = fitted.evaluate(make(source), verbose=0, return_dict=True)
        predictions = fitted.predict(make(source), verbose=0)
    else:
        history = trainer.fit(fitted, make(source), epochs=EPOCHS, callbacks=[reads])
        evaluation = trainer.evaluate(fitted, make(source), return_dict=True)
        predictions = trainer.predict(fitted, make(source))
    results[form] = {"history": history.history, "evaluate": evaluation, "read": reads.per_epoch[1:],
                     "iterations": int(fitted.optimizer.iterations.numpy())}
    arrays[f"{form}/weights"] = np.concatenate([v.ravel() for v in fitted.get_weights()])
    arrays[f"{form}/predictions"] = predictions

info = cluster_info()
task = f"{info.task_type or 'single'}{info.task_id}"
np.savez(os.path.join(args.out, f"{task}.npz"), **arrays)
with open(os.path.join(args.out, f"{task}.json"), "w") as f:
    json.dump(results, f)
