"""Shared test set-up.

The pytest process gets 4 logical CPU devices, so in-process tests can build
MirroredStrategy over 1, 2 or 4 replicas. Strategies of different sizes share
collective group keys in one process, so in-process multi-replica tests use
`cross_device_ops=ReductionToOneDevice()`; tests that need the default
cross-device ops run one subprocess per device layout (see `run_python`).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 4
)

import keras  # noqa: E402

TESTS = Path(__file__).parent


def mirrored(num_replicas: int) -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy over the first `num_replicas` logical CPUs, safe in-process."""
    return tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(num_replicas)],
        cross_device_ops=tf.distribute.ReductionToOneDevice(),
    )


def tiny_data(n: int = 203, seed: int = 0):
    """(x, y, w): 8 features, 3 classes, positive sample weights."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64") + (x[:, 2] > 1).astype("int64")
    w = rng.uniform(0.5, 2.0, size=n).astype("float32")
    return x, y, w


def tiny_model(lr: float = 0.05, optimizer: str = "sgd", seed: int = 0) -> keras.Model:
    """A compiled two-layer classifier with L2 regularization and fixed initial weights."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-3)),
        keras.layers.Dense(3),
    ])
    opt = keras.optimizers.SGD(lr, momentum=0.9) if optimizer == "sgd" else keras.optimizers.Adam(lr)
    model.compile(
        optimizer=opt,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        weighted_metrics=[keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="wce")],
    )
    return model


def run_python(script: str, *args: str, env: dict | None = None, timeout: int = 300) -> dict:
    """Runs a Python file in a fresh interpreter; returns the JSON it prints last."""
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    proc = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture
def data():
    return tiny_data()
