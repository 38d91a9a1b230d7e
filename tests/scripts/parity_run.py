"""Runs tests/helpers/parity_cases.py through model.fit on one device and Trainer.fit on N replicas.

Usage: parity_run.py REPLICAS CASE[,CASE...] [OUT [CASE,...]]. With OUT, pickles each
case's runs there (model.fit's only on 1 replica: it is the same on every
layout; the cases after OUT get model.fit's run alone, the reference of other
layouts) for test_keras_parity to compare; without, prints one JSON line: for
each case, what differs from model.fit ("problems"), or the error. Under
trainer-launch (TF_CONFIG set) each worker runs the trainer's side only, with
REPLICAS replicas of its own, and writes OUT.worker<i>.
"""

import functools
import json
import os
import pickle
import tempfile
import traceback

from start import arguments, start

ARGS = arguments(__doc__, ("replicas", int), ("cases", str), ("out", str, "?"), ("reference_only", str, "?"))
REPLICAS = ARGS.replicas
start(cpus=max(REPLICAS, 1))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import parity_cases  # noqa: E402
from trainer import Trainer  # noqa: E402

# One strategy for every case: new MirroredStrategies in one process reuse collective keys. A worker's
# MultiWorkerMirroredStrategy must exist before TensorFlow runs anything: one Trainer makes it, for every case.
WORKER = "TF_CONFIG" in os.environ
TRAINER = Trainer(strategy="multi_worker", seed=0) if WORKER else None
STRATEGY = "auto" if REPLICAS == 1 or WORKER else tf.distribute.MirroredStrategy(
    [f"/cpu:{i}" for i in range(REPLICAS)])


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
    if case.form == "dataset_unknown_size":
        ds = ds.filter(lambda *example: True)  # TensorFlow can't tell its length, as files' or a service's
    if case.form == "dataset_reshuffled":
        ds = ds.shuffle(parity_cases.N, seed=7)  # reshuffled each epoch, in one order for both runs
    return ds.batch(parity_cases.BATCH, drop_remainder=case.form == "dataset_drop_remainder").prefetch(2)


def _inputs(case, x, y, w, features_only=False):
    """(args, kwargs) that give fit, evaluate or predict the data: the same for model.fit and Trainer.fit."""
    if case.form == "arrays":
        if features_only:
            return (x,), {"batch_size": parity_cases.BATCH}
        return (x, y), {"sample_weight": w, "batch_size": parity_cases.BATCH}
    parts = x if features_only or y is None else ((x, y) if w is None else (x, y, w))
    return (_form(case, parts),), {}


def _fit_kwargs(case, x, y, folder):
    kwargs = {"epochs": parity_cases.EPOCHS, "callbacks": _with_tmp(case.callbacks(), folder), "verbose": 0,
              **case.fit_kwargs}
    if case.form == "arrays" or case.form == "pydataset_workers":
        kwargs["shuffle"] = False
    if case.validation:
        kwargs["validation_data"] = (_first(x, 9), _first(y, 9))
    return kwargs


def _fits(fit, case, x, y, w, folder) -> dict:
    """`case.fits` calls of `fit` (model.fit or trainer.fit) in a row; their histories, concatenated."""
    history = {}
    for _ in range(case.fits):
        args, kwargs = _inputs(case, x, y, w)
        for key, values in fit(*args, **kwargs, **_fit_kwargs(case, x, y, folder)).history.items():
            history.setdefault(key, []).extend(values)
    return history


def _reloaded(model, folder):
    """The model saved and loaded again, outside any strategy's scope."""
    path = os.path.join(folder, "reloaded.keras")
    model.save(path)
    return keras.models.load_model(path)


def _state(model, case) -> list:
    """The weights, then the state of every optimizer the model holds that has stepped (iterations, slots)."""
    from trainer import _compat

    _, optimizers = _compat.model_state(model)
    stepped = [o for o in optimizers if o.built and int(o.iterations.numpy()) > 0]
    return model.get_weights() + [v.numpy() for o in stepped for v in o.variables]


def _keras_run(case, folder):
    x, y, w = case.data()
    keras.utils.set_random_seed(0)
    model = case.build()
    history = _fits(model.fit, case, x, y, w, folder)
    state = _state(model, case)
    if case.reload:
        model = _reloaded(model, folder)
    evaluated, predicted = {}, None
    if case.evaluate:
        args, kwargs = _inputs(case, x, y, w)
        evaluated = model.evaluate(*args, **kwargs, **case.eval_kwargs, return_dict=True, verbose=0)
        args, kwargs = _inputs(case, x, y, w)
        evaluated["default"] = model.evaluate(*args, **kwargs, **case.eval_kwargs, verbose=0)  # a list or a float
    if case.predict:
        args, kwargs = _inputs(case, x, y, w, features_only=True)
        predicted = model.predict(*args, **kwargs, **case.eval_kwargs, verbose=0)
    return history, state, evaluated, predicted


def _trainer_run(case, folder):
    """The same calls as `_keras_run`, with `trainer.` in front and the model first: nothing else changed.

    The model is the user's own instance, built outside any strategy's scope, as for `model.fit`."""
    x, y, w = case.data()
    trainer = TRAINER or Trainer(strategy=STRATEGY, seed=0)
    keras.utils.set_random_seed(0)
    model = case.build()
    history = _fits(functools.partial(trainer.fit, model), case, x, y, w, folder)
    state = _state(model, case)
    evaluated, predicted = {}, None
    if case.reload:  # Keras's own evaluate and predict on the copy, as in `_keras_run`
        model = _reloaded(model, folder)
    evaluate = (lambda *a, **k: model.evaluate(*a, **k)) if case.reload else functools.partial(trainer.evaluate, model)
    predict = (lambda *a, **k: model.predict(*a, **k)) if case.reload else functools.partial(trainer.predict, model)
    if case.evaluate:
        args, kwargs = _inputs(case, x, y, w)
        evaluated = evaluate(*args, **kwargs, **case.eval_kwargs, return_dict=True, verbose=0)
        args, kwargs = _inputs(case, x, y, w)
        evaluated["default"] = evaluate(*args, **kwargs, **case.eval_kwargs, verbose=0)
    if case.predict:
        args, kwargs = _inputs(case, x, y, w, features_only=True)
        predicted = predict(*args, **kwargs, **case.eval_kwargs, verbose=0)
    return history, state, evaluated, predicted


def _keras_under_strategy(case) -> list:
    """Final weights of Keras's own fit with the model built in STRATEGY's scope."""
    x, y, w = case.data()
    keras.utils.set_random_seed(0)
    with STRATEGY.scope():
        model = case.build()
    model.fit(x, y, sample_weight=w, batch_size=parity_cases.BATCH, epochs=parity_cases.EPOCHS, shuffle=False,
              verbose=0)
    return model.get_weights()


def main():
    """With OUT, pickles each case's runs for test_keras_parity to compare (model.fit's on 1 replica only);
    without, compares here and prints what differs."""
    out = ARGS.out
    reference_only = ARGS.reference_only.split(",") if ARGS.reference_only else []
    results = {}
    for name in [*ARGS.cases.split(","), *reference_only]:
        case = parity_cases.CASES[name]
        with tempfile.TemporaryDirectory() as folder:
            try:
                reference = _keras_run(case, folder) if out is None or (REPLICAS == 1 and not WORKER) else None
                trained = None if name in reference_only else _trainer_run(case, folder)
                run = {"keras": reference, "trainer": trained, "keras_under_strategy": None}
                # On 3 replicas Keras crashes on the 2+2+1 split; on workers the one strategy is the trainer's.
                if case.keras_differs_on_replicas and REPLICAS == 2 and not WORKER:
                    run["keras_under_strategy"] = _keras_under_strategy(case)
                results[name] = run
            except Exception:  # reported per case, so one crash does not hide the others
                results[name] = {"error": traceback.format_exc()[-3000:]}
    if out is not None:
        if WORKER:
            out = f"{out}.worker{json.loads(os.environ['TF_CONFIG'])['task']['index']}"
        with open(out, "wb") as f:
            pickle.dump(results, f)
        return
    print(json.dumps({name: {"error": run["error"]} if "error" in run else
                      {"problems": parity_cases.compare(run["keras"], run["trainer"], parity_cases.CASES[name],
                                                        REPLICAS)} for name, run in results.items()}))


if __name__ == "__main__":
    main()
