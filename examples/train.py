"""Trains a small classifier: the script docs/howto/cluster.md takes from model.fit to a cluster."""

import argparse

import keras
import numpy as np
import tensorflow as tf

from trainer import Trainer, cluster_info

parser = argparse.ArgumentParser(description="Trains a small classifier on any layout.")
parser.add_argument("--epochs", type=int, default=5)
parser.add_argument("--strategy", default="auto", help="a strategy's name (default: auto)")
parser.add_argument("--cpu-replicas", type=int, default=0, help="N logical CPU devices to stand for N GPUs")
args = parser.parse_args()
if args.cpu_replicas:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpu_replicas)

trainer = Trainer(strategy=args.strategy)  # first: a multi-worker strategy must exist before other TF work

rng = np.random.default_rng(0)  # stands for your data
x = rng.normal(size=(2000, 20)).astype("float32")
y = (x[:, :10].sum(axis=1) > 0).astype("int32")
(x_train, y_train), (x_test, y_test) = (x[:1600], y[:1600]), (x[1600:], y[1600:])

keras.utils.set_random_seed(0)
model = keras.Sequential([
    keras.Input((20,)),
    keras.layers.Dense(32, activation="relu"),
    keras.layers.Dense(2),
])
model.compile(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
trainer.fit(model, x_train, y_train, batch_size=64, epochs=args.epochs, validation_split=0.1)
loss, accuracy = trainer.evaluate(model, x_test, y_test, batch_size=64, verbose=0)
print(f"test loss {loss:.6f}, accuracy {accuracy:.4f}")
if cluster_info().is_chief:  # every worker holds the same model: one writes it
    model.save("model.keras")
