"""The tiny problem every test trains on. No device set-up here: scripts import it too."""

import keras
import numpy as np


def tiny_data(n: int = 203, seed: int = 0):
    """(x, y, w): 8 features, 3 classes, positive sample weights."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype("float32")
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype("int64") + (x[:, 2] > 1).astype("int64")
    w = rng.uniform(0.5, 2.0, size=n).astype("float32")
    return x, y, w


def tiny_model(lr: float = 0.05, optimizer: str = "sgd", seed: int = 0, regularized: bool = True,
               steps_per_execution: int = 1, **optimizer_options) -> keras.Model:
    """A compiled two-layer classifier with L2 regularization (unless not `regularized`) and fixed initial weights.

    `optimizer_options` go to the optimizer (`global_clipnorm=...`, `gradient_accumulation_steps=...`).
    """
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((8,)),
        keras.layers.Dense(16, activation="relu",
                           kernel_regularizer=keras.regularizers.L2(1e-3) if regularized else None),
        keras.layers.Dense(3),
    ])
    if optimizer == "sgd":
        opt = keras.optimizers.SGD(lr, momentum=0.9, **optimizer_options)
    else:
        opt = keras.optimizers.Adam(lr, **optimizer_options)
    model.compile(
        optimizer=opt,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        weighted_metrics=[keras.metrics.SparseCategoricalCrossentropy(from_logits=True, name="wce")],
        steps_per_execution=steps_per_execution,
    )
    return model
