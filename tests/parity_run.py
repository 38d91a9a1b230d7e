"""Runs tests/parity_cases.py through model.fit on one device and Trainer.fit on N replicas.

Usage: parity_run.py REPLICAS CASE[,CASE...]. Prints one JSON line: for each
case, what differs from model.fit ("problems"), or the error.
"""

import json
import os
import sys
import tempfile
import traceback

import tensorflow as tf

REPLICAS = int(sys.argv[1])
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * max(REPLICAS, 1))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import parity_cases  # noqa: E402
from trainer import Trainer  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
# One strategy for every case: new MirroredStrategies in one process reuse collective keys.
STRATEGY = "auto" if REPLICAS == 1 else tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])


def _first(tree, n):
    return tf.nest.map_structure(lambda a: a[:n], tree)


def _with_tmp(callbacks, folder):
    for cb in callbacks:
        if hasattr(cb, "filepath"):
            cb.filepath = cb.filepath.format(tmp=folder)
    return callbacks


class _Batches(keras.utils.PyDataset):
    """The data as a PyDataset with two worker threads, batch by batch."""

    def __init__(self, parts, **kwargs):
        super().__init__(**kwargs)
        self.parts = parts

    def __len__(self):
        return -(-len(tf.nest.flatten(self.parts)[0]) // parity_cases.BATCH)

    def __getitem__(self, i):
        rows = slice(i * parity_cases.BATCH, (i + 1) * parity_cases.BATCH)
        parts = self.parts if isinstance(self.parts, tuple) else (self.parts,)  # Keras takes x alone as (x,)
        return tuple(tf.nest.map_structure(lambda a: a[rows], parts))


def _form(case, parts):
    """`parts` ((x, y[, w]), or x alone) in the case's form: a fresh object for each use."""
    if case.form == "pydataset_workers":
        return _Batches(parts, workers=2)
    if case.form == "generator":
        batches = _Batches(parts)
        return (batches[i] for i in range(len(batches)))
    ds = tf.data.Dataset.from_tensor_slices(parts)
    if case.form == "dataset_reshuffled":
        ds = ds.shuffle(parity_cases.N, seed=7)  # reshuffled each epoch, in one order for both runs
    return ds.batch(parity_cases.BATCH, drop_remainder=case.form == "dataset_drop_remainder").prefetch(2)


def _inputs(case, x, y, w, features_only=False):
    """(args, kwargs) that give fit, evaluate or predict the data: the same for model.fit and Trainer.fit."""
    if case.form == "arrays":
        if features_only:
            return (x,), {"batch_size": parity_cases.BATCH}
        return (x, y), {"sample_weight": w, "batch_size": parity_cases.BATCH}
    parts = x if features_only else ((x, y) if w is None else (x, y, w))
    return (_form(case, parts),), {}


def _fit_kwargs(case, x, y, folder):
    kwargs = {"epochs": parity_cases.EPOCHS, "callbacks": _with_tmp(case.callbacks(), folder), "verbose": 0,
              **case.fit_kwargs}
    if case.form == "arrays" or case.form == "pydataset_workers":
        kwargs["shuffle"] = False
    if case.validation:
        kwargs["validation_data"] = (_first(x, 9), _first(y, 9))
    return kwargs


def _keras_run(case, folder):
    x, y, w = case.data()
    keras.utils.set_random_seed(0)
    model = case.build()
    args, kwargs = _inputs(case, x, y, w)
    history = model.fit(*args, **kwargs, **_fit_kwargs(case, x, y, folder))
    evaluated = {}
    if case.evaluate:
        args, kwargs = _inputs(case, x, y, w)
        evaluated = model.evaluate(*args, **kwargs, return_dict=True, verbose=0)
    args, kwargs = _inputs(case, x, y, w, features_only=True)
    predicted = model.predict(*args, **kwargs, verbose=0)
    return history.history, model.get_weights(), evaluated, predicted


def _trainer_run(case, folder):
    """The same calls as `_keras_run`, with `trainer.` in front and the model first: nothing else changed."""
    x, y, w = case.data()
    trainer = Trainer(strategy=STRATEGY, seed=0)
    args, kwargs = _inputs(case, x, y, w)
    history = trainer.fit(case.build, *args, **kwargs, **_fit_kwargs(case, x, y, folder))
    model = history.model
    evaluated = {}
    if case.evaluate:
        args, kwargs = _inputs(case, x, y, w)
        evaluated = trainer.evaluate(model, *args, **kwargs, return_dict=True, verbose=0)
    args, kwargs = _inputs(case, x, y, w, features_only=True)
    predicted = trainer.predict(model, *args, **kwargs, verbose=0)
    return history.history, model.get_weights(), evaluated, predicted


def _keras_under_strategy(case) -> list:
    """Final weights of Keras's own fit with the model built in STRATEGY's scope."""
    x, y, w = case.data()
    keras.utils.set_random_seed(0)
    with STRATEGY.scope():
        model = case.build()
    model.fit(x, y, sample_weight=w, batch_size=parity_cases.BATCH, epochs=parity_cases.EPOCHS, shuffle=False,
              verbose=0)
    return model.get_weights()


def _close(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and np.allclose(a, b, rtol=RTOL, atol=ATOL)


def compare(reference, result, per_replica=()) -> list[str]:
    (ref_hist, ref_w, ref_ev, ref_pred), (hist, w, ev, pred) = reference, result
    problems = []
    for key, values in ref_hist.items():
        if REPLICAS > 1 and key in per_replica:
            if key not in hist or not np.allclose(values, hist[key], rtol=0.1):
                problems.append(f"history[{key!r}] is not even close: {values} vs {hist.get(key)}")
        elif key not in hist:
            problems.append(f"history lacks {key!r} (has {sorted(hist)})")
        elif not _close(values, hist[key]):
            problems.append(f"history[{key!r}]: model.fit {values}, trainer {hist[key]}")
    if len(ref_w) != len(w) or not all(_close(a, b) for a, b in zip(ref_w, w)):
        problems.append("final weights differ")
    for key, value in ref_ev.items():
        if key not in ev:
            problems.append(f"evaluate lacks {key!r} (has {sorted(ev)})")
        elif not _close(value, ev[key]):
            problems.append(f"evaluate[{key!r}]: model.evaluate {value}, trainer {ev[key]}")
    ref_flat, flat = tf.nest.flatten(ref_pred), tf.nest.flatten(pred)
    if len(ref_flat) != len(flat) or not all(_close(a, b) for a, b in zip(ref_flat, flat)):
        problems.append("predict differs")
    return problems


def main():
    results = {}
    for name in sys.argv[2].split(","):
        case = parity_cases.CASES[name]
        with tempfile.TemporaryDirectory() as folder:
            try:
                reference = _keras_run(case, folder)
                results[name] = {"problems": compare(reference, _trainer_run(case, folder), case.per_replica)}
                if case.keras_differs_on_replicas and REPLICAS == 2:  # on 3, Keras crashes on the 2+2+1 split
                    weights = _keras_under_strategy(case)
                    results[name]["keras_under_strategy_differs"] = not all(
                        _close(a, b) for a, b in zip(reference[1], weights))
            except Exception:  # reported per case, so one crash does not hide the others
                results[name] = {"error": traceback.format_exc()[-3000:]}
    print(json.dumps(results))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
