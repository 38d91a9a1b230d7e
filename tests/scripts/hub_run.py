"""Fits tests/helpers/hub_models.py's KerasHub tasks through Trainer.fit (and model.fit) under one layout.

Usage: hub_run.py OUT CASE[,CASE...] [REPLICAS]. Without TF_CONFIG, one
process of REPLICAS logical CPUs (default 1); on one replica it also runs
model.fit, the reference. Under trainer-launch, each task is a worker of a
MultiWorkerMirroredStrategy. Writes OUT/<case>.<runner>.<task>.pkl: history,
evaluate, predict and weights. Every run makes the same calls, the task's own
data forms (strings, a dict of strings, uint8 images), with a global batch of 8
over 21 examples (a last batch of 5).

A task batches arrays with grain where grain is installed, else with tf.data;
HUB_PIPELINE=tf.data hides grain, so that each pipeline can be run.
"""

import os
import pickle
import sys

from start import arguments, start

args = arguments(__doc__, ("out", str), ("cases", str), ("replicas", int, "?"))
out, names, replicas = args.out, args.cases.split(","), args.replicas or 1
if os.environ.get("HUB_PIPELINE") == "tf.data":
    sys.modules["grain"] = None  # `import grain` then fails, and KerasHub builds tf.data pipelines
workers = "TF_CONFIG" in os.environ
start(cpus=0 if workers else replicas)

from trainer import Trainer, cluster_info  # noqa: E402

# Multi-worker strategies must exist before TensorFlow runs anything, so the Trainer comes first.
trainer = Trainer(strategy="multi_worker" if workers else "mirrored" if replicas > 1 else "auto", batch_size=8,
                  verbose=0, seed=0)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import hub_models  # noqa: E402

info = cluster_info()
task = f"{info.task_type or 'single'}{info.task_id}"


def run(name: str, runner: str) -> dict:
    keras.utils.set_random_seed(0)
    model, calls = hub_models.CASES[name](np.random.default_rng(0))
    phases = [calls["fit"]] + ([calls["fit"]] if "then" in calls else [])
    history = {}
    for i, fit in enumerate(phases):
        if i:
            calls["then"](model)
        if runner == "keras":
            logs = model.fit(**fit, batch_size=None if "y" not in fit and not isinstance(fit["x"], dict) else 8,
                             verbose=0).history
        else:
            logs = trainer.fit(model, **fit).history
        for key, values in logs.items():
            history.setdefault(key, []).extend(values)
    batch = {} if not isinstance(calls["evaluate"]["x"], (np.ndarray, dict)) else {"batch_size": 8}
    if runner == "keras":
        evaluate = model.evaluate(**calls["evaluate"], **batch, verbose=0)
        predict = None if calls["predict"] is None else model.predict(**calls["predict"], batch_size=8, verbose=0)
    else:
        evaluate = trainer.evaluate(model, **calls["evaluate"])
        predict = None if calls["predict"] is None else trainer.predict(model, **calls["predict"])
    return {"history": history, "evaluate": evaluate, "predict": predict,
            "weights": [np.array(w) for w in model.get_weights()]}


for name in names:
    for runner in (["keras"] if replicas == 1 and not workers else []) + ["trainer"]:
        with open(os.path.join(out, f"{name}.{runner}.{task}.pkl"), "wb") as f:
            pickle.dump(run(name, runner), f)
print("done", task)
