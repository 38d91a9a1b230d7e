"""Trains the model families of the uneven-last-batch tests under one device layout; saves what came out.

Usage: python last_batch_run.py STRATEGY NUM_DEVICES OUT.npz [FAMILY,...]
  STRATEGY: "none" (no strategy, the reference) or "mirrored" over NUM_DEVICES
  logical CPUs with TensorFlow's default cross-device ops (collectives).
  FAMILY: the families to run (default: all of families.FAMILIES).
The caller sets TF_ENABLE_ONEDNN_OPTS: TensorFlow reads it once, at start-up.

Every family is an Embedding, recurrent or convolutional model, fitted with
steps_per_execution="auto" (so the uneven last step would share a call with
full ones) on two sizes of data, in global batches of 12:
  "fused": 30 examples: a last batch of 6, split evenly on 2 and 3 replicas
    (3+3, 2+2+2), so TensorFlow all-gathers an Embedding's sparse gradient
    with the same collective as in the full steps (6+6, 4+4+4), in another shape.
  "tiny": 13 examples: a last batch of 1, smaller than the replica count.
Validation has 9 examples: one batch, split unevenly on 2 replicas.
Each family's model is fitted four times in a row (a dataset, then arrays, of
each size), each time validated on 9 examples, then evaluated and predicted:
one model per family keeps the tracing, most of the run's time, to one trace
per kind of input. With no strategy, Keras's own model.fit of a fresh model on
the first dataset (read in the same order) is recorded too.
"""

import json

from start import arguments, start

args = arguments(__doc__, ("strategy", str), ("num_devices", int), ("out", str), ("families", str, "?"))
strategy_name, num_devices, out = args.strategy, args.num_devices, args.out
chosen = args.families.split(",") if args.families else None
start(cpus=num_devices)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from families import BATCH, FAMILIES, SIZES, as_dataset, make_data, make_model  # noqa: E402

from trainer import Trainer  # noqa: E402

strategy = (tf.distribute.get_strategy() if strategy_name == "none"
            else tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(num_devices)]))
trainer = Trainer(strategy=strategy, batch_size=BATCH, lr_scaling=None, seed=0, verbose=0)
results, arrays = {}, {}
for family in chosen or FAMILIES:
    val_x, val_y = make_data(family, 9, seed=1)
    model = make_model(family)
    for case, form in [("fused", "dataset"), ("fused", "arrays"), ("tiny", "dataset"), ("tiny", "arrays")]:
        key = f"{family}/{case}/{form}"
        x, y = make_data(family, SIZES[case], seed=0)
        data, val = ((x, y), (val_x, val_y)) if form == "arrays" else (as_dataset(x, y), as_dataset(val_x, val_y))
        history = trainer.fit(model, data, epochs=2, validation_data=val)
        results[key] = {"history": history.history, "evaluate": trainer.evaluate(model, data, return_dict=True)}
        arrays[f"{key}/weights"] = np.concatenate([w.ravel() for w in model.get_weights()])
        # (features,): a tuple of several inputs alone would read as (x, y), as in Keras's predict
        arrays[f"{key}/predictions"] = trainer.predict(model, x if form == "arrays" else as_dataset(x, y).map(
            lambda features, _: (features,)))
    if strategy_name == "none":
        reference = make_model(family)
        x, y = make_data(family, SIZES["fused"], seed=0)
        keras_history = reference.fit(as_dataset(x, y).batch(BATCH), epochs=2, verbose=0,
                                      validation_data=as_dataset(val_x, val_y).batch(BATCH))
        results[f"{family}/keras"] = {"history": keras_history.history}
        arrays[f"{family}/keras/weights"] = np.concatenate([w.ravel() for w in reference.get_weights()])

np.savez(out, **arrays)
print(json.dumps({"results": results, "replicas": strategy.num_replicas_in_sync}))
