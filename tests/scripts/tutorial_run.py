"""TensorFlow's "Multi-worker training with Keras" tutorial on one worker of a local cluster, moved to the trainer.

Usage: tutorial_run.py MODE OUT.json, with the TF_CONFIG the tutorial writes. The tutorial's main.py as it stands
(its strategy made first, its model built and compiled in the strategy's scope, 3 epochs of 70 steps), on
MNIST-shaped data made here (uint8 images of 28x28, integer labels: the test has no network). MODE says how the
tutorial's `multi_worker_model.fit(...)` line is moved:

  fit          `Trainer(strategy=strategy).fit(multi_worker_model, ...)`; first, a model built outside the scope
               given to `Trainer(strategy="multi_worker")` must be refused before anything runs
  distribute   `with Trainer().distribute(): multi_worker_model.fit(...)`, the line itself unchanged

Writes the history, the sum of squares of the weights before and after, the steps taken and the refusal's message
to OUT.json.
"""

import json
import os

from start import arguments, start

args = arguments(__doc__, options=(("mode", {"choices": ["fit", "distribute"]}), ("out", {})))
MODE, OUT = args.mode, args.out
start()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer import Trainer  # noqa: E402


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)  # MNIST's format: the tutorial reads keras.datasets.mnist.load_data()
    x_train = rng.integers(0, 256, (6000, 28, 28), dtype=np.uint8)
    y_train = rng.integers(0, 10, 6000).astype(np.uint8)
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(60000).repeat().batch(batch_size)


def build_and_compile_cnn_model():
    model = keras.Sequential([
        keras.layers.InputLayer(shape=(28, 28)),
        keras.layers.Reshape(target_shape=(28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=keras.optimizers.SGD(learning_rate=0.001), metrics=["accuracy"])
    return model


per_worker_batch_size = 64
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()

def sum_of_squares(model):
    return float(sum(np.sum(w.astype(np.float64) ** 2) for w in model.get_weights()))


initial = sum_of_squares(multi_worker_model)
refusal = None
if MODE == "fit":
    outside = build_and_compile_cnn_model()
    before = [w.copy() for w in outside.get_weights()]
    try:
        Trainer(strategy="multi_worker").fit(outside, multi_worker_dataset, epochs=1, steps_per_epoch=2)
    except ValueError as err:
        refusal = str(err)
    assert all(np.array_equal(a, b) for a, b in zip(outside.get_weights(), before))
    history = Trainer(strategy=strategy).fit(multi_worker_model, multi_worker_dataset, epochs=3, steps_per_epoch=70)
else:
    with Trainer().distribute():
        history = multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)

with open(OUT, "w") as f:
    json.dump({"history": history.history, "refusal": refusal, "initial": initial,
               "weights": sum_of_squares(multi_worker_model),
               "iterations": int(multi_worker_model.optimizer.iterations.numpy())}, f)
