"""The input forms of TensorFlow's "Distributed input" guide, trained in one device layout; saves what each gave.

Usage: python distributed_input_run.py OUT_DIR [--replicas N] [--reference]

`--reference`: `model.fit`, `evaluate` and `predict` on one device, on the batched dataset each form is made from.
Otherwise, in a strategy of N CPU replicas (a MultiWorkerMirroredStrategy under TF_CONFIG, as trainer-launch sets
it), every form through the trainer: a dataset distributed with `experimental_distribute_dataset`, one distributed
with `distribute_datasets_from_function`, the bare function, and the first and the last inside
`Trainer.distribute()` through `model.fit`. Each task writes OUT_DIR/<task>.json and OUT_DIR/<task>.npz.
"""

import json
import os

import numpy as np
import tensorflow as tf

from start import REFERENCE, REPLICAS, arguments, start, user_strategy

args = arguments(__doc__, ("out", str), options=(REPLICAS, REFERENCE))
start(cpus=args.replicas if args.replicas > 1 else 0)
strategy = user_strategy(args.replicas, reference=args.reference)

import keras  # noqa: E402

from trainer import Trainer, cluster_info  # noqa: E402

GLOBAL_BATCH, EPOCHS = 48, 3
rng = np.random.default_rng(0)
x = rng.normal(size=(100, 6)).astype("float32")  # 100 rows: a last batch of 4
y = (x[:, 0] + x[:, 1] > 0).astype("int64")


def dataset() -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
    """The guide's form: each input pipeline its shard of the rows, in batches of its replicas' share."""
    rows = tf.data.Dataset.from_tensor_slices((x, y)).shard(context.num_input_pipelines, context.input_pipeline_id)
    return rows.batch(context.get_per_replica_batch_size(GLOBAL_BATCH))


def model() -> keras.Model:
    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(2)])
    built.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return built


def result(fitted: keras.Model, history, evaluation) -> tuple[dict, dict]:
    summary = {"history": history.history, "evaluate": evaluation,
               "iterations": int(fitted.optimizer.iterations.numpy())}
    weights = np.concatenate([w.ravel() for w in fitted.get_weights()])
    return summary, {"weights": weights, "predictions": fitted.predict(x, verbose=0)}


results, arrays = {}, {}
if args.reference:
    reference = model()
    history = reference.fit(dataset(), epochs=EPOCHS, verbose=0)
    evaluation = reference.evaluate(dataset(), verbose=0, return_dict=True)
    results["reference"], arrays["reference"] = result(reference, history, evaluation)
else:
    trainer = Trainer(strategy=strategy, seed=0, verbose=0)
    forms = {
        "distributed_dataset": lambda: strategy.experimental_distribute_dataset(dataset()),
        "distributed_function": lambda: strategy.distribute_datasets_from_function(dataset_fn),
        "function": lambda: dataset_fn,
    }
    for name, form in forms.items():
        fitted = model()
        history = trainer.fit(fitted, form(), epochs=EPOCHS)
        evaluation = trainer.evaluate(fitted, form(), return_dict=True)
        results[name], arrays[name] = result(fitted, history, evaluation)
    for name in ("distributed_dataset", "function"):  # model.fit inside the block: its contract, its numbers
        fitted = model()
        with trainer.distribute():
            history = fitted.fit(forms[name](), epochs=EPOCHS, verbose=0)
            evaluation = fitted.evaluate(forms[name](), verbose=0, return_dict=True)
        results[f"block_{name}"], arrays[f"block_{name}"] = result(fitted, history, evaluation)
info = cluster_info()
task = f"{info.task_type or 'single'}{info.task_id}"
with open(os.path.join(args.out, f"{task}.json"), "w") as f:
    json.dump(results, f)
np.savez(os.path.join(args.out, f"{task}.npz"),
         **{f"{name}/{key}": value for name, saved in arrays.items() for key, value in saved.items()})
print(json.dumps({"task": task, "forms": sorted(results)}))
