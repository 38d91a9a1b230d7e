"""The model families of the uneven-last-batch tests, and their data. No device set-up here: scripts import it."""

import keras
import numpy as np
import tensorflow as tf

BATCH = 12
SIZES = {"fused": 30, "tiny": 13}
VOCAB, LENGTH = 20, 5


def _tokens(name):
    return keras.Input((LENGTH,), dtype="int32", name=name)


def _head(features):
    return keras.layers.Dense(3)(features)


def _embedding():
    ids = _tokens("ids")
    return ids, _head(keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 4)(ids)))


def _recurrent(layer):
    def build():
        ids = _tokens("ids")
        return ids, _head(layer(4)(keras.layers.Embedding(VOCAB, 4)(ids)))
    return build


def _siamese():
    left, right = _tokens("left"), _tokens("right")
    embed, pool = keras.layers.Embedding(VOCAB, 4), keras.layers.GlobalAveragePooling1D()
    return [left, right], _head(keras.layers.Concatenate()([pool(embed(left)), pool(embed(right))]))


def _cnn(synchronized_bn):
    def build():
        images = keras.Input((6, 6, 3), name="images")
        features = keras.layers.Conv2D(4, 3, padding="same", activation=None if synchronized_bn else "relu")(images)
        if synchronized_bn:
            features = keras.layers.ReLU()(keras.layers.BatchNormalization(synchronized=True)(features))
        features = keras.layers.MaxPooling2D(2)(features)
        return images, _head(keras.layers.Flatten()(features))
    return build


FAMILIES = {
    "embedding": _embedding,
    "gru": _recurrent(keras.layers.GRU),
    "lstm": _recurrent(keras.layers.LSTM),
    "siamese": _siamese,
    "cnn": _cnn(False),
    "cnn_syncbn": _cnn(True),
}


def make_model(family):
    keras.utils.set_random_seed(0)
    inputs, outputs = FAMILIES[family]()
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.1, momentum=0.5),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def make_data(family, n, seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, size=n)
    if family.startswith("cnn"):
        x = rng.normal(size=(n, 6, 6, 3)).astype("float32") + y[:, None, None, None].astype("float32")
    else:
        x = rng.integers(0, VOCAB, size=(n, LENGTH)).astype("int32")
        x[:, 0] = y  # a token that tells the class, so that training moves
        if family == "siamese":
            x = (x, rng.integers(0, VOCAB, size=(n, LENGTH)).astype("int32"))
    return x, y


def as_dataset(x, y):
    return tf.data.Dataset.from_tensor_slices((x, y))
