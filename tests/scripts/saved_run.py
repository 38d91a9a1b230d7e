"""What `fit` leaves behind: a model trained through the trainer saves, exports and reloads as after model.fit.

Usage: saved_run.py REPLICAS CASE[,CASE...] OUT. For each case (`plain`: a two-Dense Sequential; `lora`: a
KerasHub text classifier whose backbone has LoRA enabled, rank 4), one model is fitted by model.fit on one device
and its twin by Trainer.fit on REPLICAS replicas (under trainer-launch, on this worker), with the same seed and data.
Each then goes through every way Keras and TensorFlow keep a model, and what each gives back is pickled to OUT
(OUT.worker<i> on a worker) for tests/model/test_saved.py to compare:

  predict       model.predict
  load_model    model.save, then keras.models.load_model's predict
  load_weights  save_weights, then a fresh twin's load_weights and predict
  export        model.export(format="tf_saved_model"), then tf.saved_model.load's `serve`
  saved_model   tf.saved_model.save's variables, as tf.train.load_checkpoint reads them
  checkpoint    tf.train.Checkpoint(model=, optimizer=)'s variables, and a fresh twin restored from it
"""

import json
import os
import pickle
import tempfile

from start import arguments, start

args = arguments(__doc__, ("replicas", int), ("cases", str), ("out", str))
REPLICAS, CASES, OUT = args.replicas, args.cases.split(","), args.out
start(cpus=REPLICAS)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer import Trainer  # noqa: E402

WORKER = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index")
TRAINER = Trainer(strategy="multi_worker" if WORKER is not None else "auto" if REPLICAS == 1
                  else tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)]), seed=0, verbose=0)


def plain():
    rng = np.random.default_rng(0)
    x = rng.random((45, 6)).astype("float32")
    y = rng.integers(0, 3, 45)

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
        model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        return model

    return build, x, y, x  # the features `serve` takes


def lora():
    import hub_models

    rng = np.random.default_rng(0)
    _, data = hub_models.text_classifier(rng)
    x, y = data["fit"]["x"], data["fit"]["y"]

    def build():
        keras.utils.set_random_seed(0)
        model, _ = hub_models.text_classifier(np.random.default_rng(0))
        model.backbone.enable_lora(rank=4)
        model.compile(optimizer=keras.optimizers.Adam(1e-3))  # KerasHub's loss and metrics, a LoRA-sized rate
        return model

    # `serve` takes the task's call's inputs (token ids, int32 as exported), not its preprocessing's
    served = {key: tf.cast(value, "int32") for key, value in build().preprocessor(x).items()}
    return build, x, y, served


def kept(model, build, x, served, folder) -> dict:
    """What each way of keeping `model` gives back."""
    path = lambda name: os.path.join(folder, name)  # noqa: E731
    out = {"initial": build().predict(x, batch_size=8, verbose=0), "predict": model.predict(x, batch_size=8, verbose=0)}
    model.save(path("model.keras"))
    out["load_model"] = keras.models.load_model(path("model.keras")).predict(x, batch_size=8, verbose=0)
    model.save_weights(path("model.weights.h5"))
    fresh = build()
    fresh.load_weights(path("model.weights.h5"))
    out["load_weights"] = fresh.predict(x, batch_size=8, verbose=0)
    model.export(path("exported"), format="tf_saved_model", verbose=False)
    exported = tf.saved_model.load(path("exported"))
    out["export"] = keras.tree.map_structure(np.asarray, exported.serve(served))
    tf.saved_model.save(model, path("saved_model"))
    out["saved_model"] = _variables(path("saved_model/variables/variables"))
    prefix = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(path("ckpt/state"))
    out["checkpoint"] = _variables(prefix)
    fresh = build()
    tf.train.Checkpoint(model=fresh, optimizer=fresh.optimizer).read(prefix).expect_partial()
    out["checkpoint_restored"] = fresh.predict(x, batch_size=8, verbose=0)
    return out


def _variables(prefix) -> dict:
    reader = tf.train.load_checkpoint(prefix)
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if key != "_CHECKPOINTABLE_OBJECT_GRAPH"}


results = {}
for case in CASES:
    build, x, y, served = {"plain": plain, "lora": lora}[case]()
    fit = dict(batch_size=8, epochs=2, shuffle=False, verbose=0)
    reference, ours = build(), build()
    reference.fit(x, y, **fit)
    TRAINER.fit(ours, x, y, **fit)
    with tempfile.TemporaryDirectory() as theirs_folder, tempfile.TemporaryDirectory() as our_folder:
        results[case] = {"model.fit": kept(reference, build, x, served, theirs_folder),
                         "trainer.fit": kept(ours, build, x, served, our_folder)}
with open(OUT if WORKER is None else f"{OUT}.worker{WORKER}", "wb") as f:
    pickle.dump(results, f)
