"""Two MirroredStrategies over the same devices in one process, as keras.io's guide makes them (a new one for each
training run), used in turn by the trainer and by Keras's own fit, in an order that launches their collectives
differently.

Usage: user_strategies_run.py FIRST SECOND, on 2 logical CPUs. FIRST is what runs on the first strategy:
"trainer-predict", "trainer-fit", "keras-fit" or "none"; SECOND is who fits a model built in the second's scope:
"trainer" (given `strategy=` per call, as the guide's script moves to the trainer) or "keras" (Keras's own fit).
Prints one JSON line: the second fit's history and final weights, and model.fit's on one device.
"""

import json

from start import arguments, start

args = arguments(__doc__, options=(("first", {"choices": ["trainer-predict", "trainer-fit", "keras-fit", "none"]}),
                                   ("second", {"choices": ["trainer", "keras"]})))
FIRST, SECOND = args.first, args.second
start(cpus=2)

import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from trainer import Trainer  # noqa: E402

rng = np.random.default_rng(0)
x = rng.random((101, 8)).astype("float32")
y = (x.sum(axis=1) > 4).astype("int32")


def model():
    keras.utils.set_random_seed(0)
    built = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)])
    built.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return built


def result(history, trained):
    return {"history": history.history, "weights": [w.ravel().tolist() for w in trained.get_weights()]}


reference = model()
one_device = result(reference.fit(x, y, batch_size=32, shuffle=False, verbose=0), reference)

trainer = Trainer(verbose=0)
if FIRST != "none":
    first = tf.distribute.MirroredStrategy()
    with first.scope():
        first_model = model()
    if FIRST == "trainer-predict":
        trainer.predict(first_model, x, strategy=first)
    elif FIRST == "trainer-fit":
        trainer.fit(first_model, x, y, batch_size=32, shuffle=False, strategy=first)
    else:
        with first.scope():
            first_model.fit(x, y, batch_size=32, shuffle=False, verbose=0)

second = tf.distribute.MirroredStrategy()
with second.scope():
    second_model = model()
if SECOND == "trainer":
    history = trainer.fit(second_model, x, y, batch_size=32, shuffle=False, strategy=second)
else:
    with second.scope():
        history = second_model.fit(x, y, batch_size=32, shuffle=False, verbose=0)
print(json.dumps({"second": result(history, second_model), "one_device": one_device}))
