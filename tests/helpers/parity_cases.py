"""Everyday Keras training patterns, one row each, for the Keras-parity test.

Each case builds a compiled model (unseeded: the runner seeds before each
build) and data, and is fitted twice: by `model.fit` on one device, and by
`Trainer.fit` on 1, 2 or 3 replicas, each given the user's own instance,
built outside any strategy's scope, with the same global batch and no
shuffling. 29 examples in batches of 8 leave a last batch of 5, split 3+2 on
two replicas and 2+2+1 on three.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import keras
import numpy as np
from keras import ops

N, BATCH, EPOCHS = 29, 8, 2


@dataclasses.dataclass
class Case:
    build: Callable[[], keras.Model]
    data: Callable[[], tuple]  # (x, y, sample_weight or None)
    callbacks: Callable[[], list] = list
    validation: bool = False  # validate on the first 9 examples each epoch
    # History keys that may differ on several replicas, with why: what the model's own code
    # computes per replica, which the trainer cannot make exact (final weights, evaluate
    # and predict are still checked).
    per_replica: dict[str, str] = dataclasses.field(default_factory=dict)
    # Keras's own fit under the same MirroredStrategy gives other final weights (the row is
    # where the trainer gives one device's numbers and Keras does not); checked on 2 replicas.
    keras_differs_on_replicas: bool = False
    evaluate: bool = True  # compare evaluate() (a GAN's has nothing to report)
    predict: bool = True  # compare predict() (a VAE without call() has none, under model.fit too)
    fits: int = 1  # fit calls in a row on the same object, each continuing the last (histories concatenated)
    reload: bool = False  # after fitting: save, load without any strategy, and evaluate and predict the copy
    # How the data reaches fit, evaluate and predict, the same for model.fit and Trainer.fit:
    # "arrays" (x, y, sample_weight=, batch_size=), or one of FORMS (parity_run.py builds them).
    form: str = "arrays"
    fit_kwargs: dict = dataclasses.field(default_factory=dict)  # more of fit's Keras arguments
    eval_kwargs: dict = dataclasses.field(default_factory=dict)  # evaluate's and predict's (steps=)


FORMS = ("dataset", "dataset_drop_remainder", "dataset_reshuffled", "dataset_unknown_size", "generator",
         "pydataset_workers")


def _rng(seed=0):
    return np.random.RandomState(seed)


def _regression():
    x = _rng(0).rand(N, 5).astype("float32")
    return x, (x @ _rng(1).rand(5, 1) + 0.1 * _rng(2).rand(N, 1)).astype("float32"), None


def _binary():
    x = _rng(0).rand(N, 5).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) > 2.5).astype("float32"), None


def _images():
    x = _rng(0).rand(N, 8, 8, 3).astype("float32")
    return x, (x[:, :4].mean(axis=(1, 2, 3)) * 3).astype("int32").clip(0, 2), None


def _classes():
    x = _rng(0).rand(N, 5).astype("float32")
    return x, (x[:, :3].argmax(axis=1)).astype("int32"), None


def _class_column():
    x, y, _ = _classes()
    return x, y[:, None], None  # (examples, 1), the shape CategoricalTruePositives compares with


def _dense(units=1, activation=None, **kwargs):
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu", **kwargs),
                             keras.layers.Dense(units, activation=activation)])


def _compiled(model, loss="mse", metrics=None, optimizer=None, **kwargs):
    model.compile(optimizer or keras.optimizers.SGD(0.1), loss=loss, metrics=metrics, **kwargs)
    return model


# Models that bring their own steps (the Keras guide "Customizing what happens in fit()") ----


class GuideCustomModel(keras.Model):
    """The guide's first example: its own train_step, through compute_loss and self.metrics."""

    def train_step(self, data):
        import tensorflow as tf

        x, y = data[:2]
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def _own_gradient_step(model, data):
    """A train_step's usual middle: (x, y, y_pred, loss) after one step of `model.loss_fn` by its optimizer."""
    import tensorflow as tf

    x, y = data[:2]
    with tf.GradientTape() as tape:
        y_pred = model(x, training=True)
        loss = model.loss_fn(y, y_pred)
    model.optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
    return x, y, y_pred, loss


class LowLevelModel(keras.Model):
    """Compiled without a loss: its own loss object, tracker and optimizer step (GAN-style)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.out = keras.layers.Dense(1)
        self.loss_fn = keras.losses.MeanSquaredError()
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

    def call(self, x):
        return self.out(self.hidden(x))

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]

    def train_step(self, data):
        x, y, y_pred, loss = _own_gradient_step(self, data)
        self.loss_tracker.update_state(_unscaled(loss), sample_weight=ops.shape(x)[0])
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    def test_step(self, data):
        x, y = data[:2]
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(_unscaled(self.loss_fn(y, y_pred)), sample_weight=ops.shape(x)[0])
        self.mae_metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


class TwoOptimizerGAN(keras.Model):
    """The Keras guide's GAN pattern: compile(d_optimizer, g_optimizer, loss_fn), its own
    train_step with two optimizers, and its own trackers. The generator's input is drawn
    from the real rows, not at random, so every replica count gives the same numbers."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.generator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5, activation="tanh")])
        self.discriminator = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                                               keras.layers.Dense(1)])
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def call(self, x):
        return self.discriminator(x)

    def latent(self, real):
        return ops.sin(3.0 * real[:, :3])

    def train_step(self, data):
        import tensorflow as tf

        real = data[0] if isinstance(data, tuple) else data
        count = ops.shape(real)[0]
        latent = self.latent(real)
        labels = ops.concatenate([ops.ones((count, 1)), ops.zeros((count, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(ops.concatenate([self.generator(latent), real], 0)))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((count, 1)), self.discriminator(self.generator(latent)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(_unscaled(d_loss), sample_weight=count)
        self.g_loss_tracker.update_state(_unscaled(g_loss), sample_weight=count)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


class NoisyGAN(TwoOptimizerGAN):
    """The Keras guide's GAN with its noise: the generator's input drawn with keras.random from a SeedGenerator
    in its own train_step (one row per example)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed_generator = keras.random.SeedGenerator(5)

    def latent(self, real):
        return keras.random.normal((ops.shape(real)[0], 3), seed=self.seed_generator)


class RawLossesModel(keras.Model):
    """keras.io's WGAN-GP shape: its own steps return loss tensors, not metric results; model.fit logs the
    last step's values (means over the batch, so on several replicas their weighted sum is exact)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(4, activation="relu")
        self.out = keras.layers.Dense(1)
        self.loss_fn = keras.losses.MeanSquaredError()

    def call(self, x):
        return self.out(self.hidden(x))

    def train_step(self, data):
        _, _, y_pred, loss = _own_gradient_step(self, data)
        return {"loss": loss, "mean_prediction": ops.mean(y_pred)}

    def test_step(self, data):
        x, y = data[:2]
        return {"loss": self.loss_fn(y, self(x, training=False))}


def _features_only():
    return _regression()[0], None, None


def _gan(noise=False):
    model = NoisyGAN() if noise else TwoOptimizerGAN()
    model.compile(d_optimizer=keras.optimizers.Adam(0.01), g_optimizer=keras.optimizers.Adam(0.01, global_clipnorm=0.1),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


def _unscaled(loss):
    # Under a strategy Keras's losses come scaled by the replica's share of the batch; Keras's
    # own train_step unscales them before its loss tracker sees them, and so does this one.
    from keras.src.losses.loss import unscale_loss_for_distribution

    return unscale_loss_for_distribution(loss)


class PenaltyModel(keras.Sequential):
    """compute_loss adds a penalty on the outputs to the compiled loss."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        loss = super().compute_loss(x, y, y_pred, sample_weight, training)
        return loss + 0.5 * ops.mean(ops.square(y_pred))


class HalfTestLossModel(keras.Sequential):
    """test_step logs half the compiled loss (so evaluate differs from fit's loss)."""

    def test_step(self, data):
        x, y = data[:2]
        y_pred = self(x, training=False)
        loss = self.compute_loss(x, y, y_pred, training=False)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(0.5 * _unscaled(loss), sample_weight=ops.shape(x)[0])
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


class ExtraMetricModel(keras.Sequential):
    """compute_metrics updates a metric of its own besides the compiled ones."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_error = keras.metrics.Mean(name="mean_abs_pred")

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        self.max_error.update_state(ops.abs(y_pred))
        return super().compute_metrics(x, y, y_pred, sample_weight)


# Custom objects, never registered with Keras --------------------------------------------


class CustomMSE(keras.losses.Loss):
    """The Keras guide's: mean squared error plus a regularization factor on the predictions."""

    def __init__(self, regularization_factor=0.1, name="custom_mse"):
        super().__init__(name=name)
        self.regularization_factor = regularization_factor

    def call(self, y_true, y_pred):
        mse = ops.mean(ops.square(y_true - y_pred), axis=-1)
        reg = ops.mean(ops.square(0.5 - y_pred), axis=-1)
        return mse + reg * self.regularization_factor


class CategoricalTruePositives(keras.metrics.Metric):
    """The Keras guide's: counts the examples whose argmax is the label."""

    def __init__(self, name="categorical_true_positives", **kwargs):
        super().__init__(name=name, **kwargs)
        self.true_positives = self.add_variable(shape=(), name="ctp", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = ops.reshape(ops.argmax(y_pred, axis=1), (-1, 1))
        values = ops.cast(ops.cast(y_true, "int32") == ops.cast(y_pred, "int32"), "float32")
        self.true_positives.assign_add(ops.sum(values))

    def result(self):
        return self.true_positives

    def reset_state(self):
        self.true_positives.assign(0.0)


def plain_loss(y_true, y_pred):
    return ops.mean(ops.abs(y_true - y_pred), axis=-1)


class MeanPenalty(keras.layers.Layer):
    """add_loss of a per-batch mean, as a VAE's KL term is."""

    def call(self, x):
        self.add_loss(0.3 * ops.mean(ops.square(x)))
        return x


class LogisticEndpoint(keras.layers.Layer):
    """keras.io's endpoint layer: a Keras Loss called on targets fed as inputs, its value handed to add_loss."""

    def __init__(self, name=None):
        super().__init__(name=name)
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def call(self, targets, logits):
        self.add_loss(self.loss_fn(targets, logits))
        return ops.sigmoid(logits)


def _endpoint():
    inputs, targets = keras.Input((5,), name="inputs"), keras.Input((1,), name="targets")
    outputs = LogisticEndpoint(name="predictions")(targets, keras.layers.Dense(1)(inputs))
    model = keras.Model([inputs, targets], outputs)
    model.compile(optimizer=_sgd())  # no loss: the endpoint's add_loss is the loss
    return model


def _inputs_and_targets():
    x, y, _ = _binary()
    return {"inputs": x, "targets": y}, None, None


class RequiredArgumentMSE(keras.losses.Loss):
    """A loss whose constructor needs an argument and whose config leaves it out."""

    def __init__(self, weight):
        super().__init__(name="weighted_mse")
        self.weight = weight

    def call(self, y_true, y_pred):
        return self.weight * ops.mean(ops.square(y_true - y_pred), axis=-1)


class WithinTolerance(keras.metrics.Metric):
    """A metric whose constructor needs an argument: the share of predictions within `tolerance`."""

    def __init__(self, tolerance, **kwargs):
        super().__init__(name="within_tolerance", **kwargs)
        self.tolerance = tolerance
        self.hits = self.add_variable(shape=(), name="hits", initializer="zeros")
        self.count = self.add_variable(shape=(), name="count", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        close = ops.cast(ops.abs(y_true - y_pred) < self.tolerance, "float32")
        self.hits.assign_add(ops.sum(close))
        self.count.assign_add(ops.cast(ops.size(close), "float32"))

    def result(self):
        return self.hits / self.count

    def reset_state(self):
        self.hits.assign(0.0)
        self.count.assign(0.0)


class Distiller(keras.Model):
    """The keras.io knowledge-distillation example: its own compile() and a compute_loss that calls the teacher."""

    def __init__(self, student, teacher):
        super().__init__()
        self.teacher = teacher
        self.student = student

    def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha=0.1, temperature=3):
        super().compile(optimizer=optimizer, metrics=metrics)
        self.student_loss_fn, self.distillation_loss_fn = student_loss_fn, distillation_loss_fn
        self.alpha, self.temperature = alpha, temperature

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False):
        teacher_pred = self.teacher(x, training=False)
        student_loss = self.student_loss_fn(y, y_pred)
        distillation_loss = self.distillation_loss_fn(
            ops.softmax(teacher_pred / self.temperature, axis=1),
            ops.softmax(y_pred / self.temperature, axis=1)) * (self.temperature ** 2)
        return self.alpha * student_loss + (1 - self.alpha) * distillation_loss

    def call(self, x):
        return self.student(x)


def _distiller():
    teacher = _dense(3)
    teacher.trainable = False
    model = Distiller(student=keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)]), teacher=teacher)
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=[keras.metrics.SparseCategoricalAccuracy()],
                  student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  distillation_loss_fn=keras.losses.KLDivergence(), alpha=0.1, temperature=10)
    return model


class VAE(keras.Model):
    """The keras.io VAE's shape: an encoder and a decoder, its own train_step and trackers, and no call().

    As on keras.io, its step uses `data` itself as the images (Keras hands a
    step x alone for `fit(x)` on arrays) and returns the "total_loss" tracker
    under the key "loss". One change: its sampling noise is drawn from the
    inputs, not at random, so that every replica count gives the same numbers
    (as in the GAN row)."""

    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = encoder, decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        import tensorflow as tf

        x = data
        with tf.GradientTape() as tape:
            z_mean, z_log_var = self.encoder(x)
            z = z_mean + ops.exp(0.5 * z_log_var) * ops.sin(7.0 * x[:, :2])
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(ops.sum(ops.square(x - reconstruction), axis=1))
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result()}


def _vae():
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(4, activation="relu")(inputs)
    encoder = keras.Model(inputs, [keras.layers.Dense(2)(hidden), keras.layers.Dense(2)(hidden)])
    decoder = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(5)])
    model = VAE(encoder, decoder)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


def _lambda_model():
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, activation="relu"),
                             keras.layers.Lambda(lambda t: 2.0 * t + 0.1), keras.layers.Dense(1)])


# Sequences and masks ----------------------------------------------------------------------


def _padded_tokens():
    rng = _rng(3)
    lengths = rng.randint(1, 7, N)
    tokens = np.zeros((N, 6), "int32")
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.randint(1, 20, n)
    tags = np.where(tokens > 0, tokens % 3, 0).astype("int32")
    return tokens, tags, None


def _padded_pairs():
    """Source and target token sequences of their own lengths, zero-padded; the target shifted for teacher forcing."""
    source, _, _ = _padded_tokens()
    rng = _rng(4)
    target = np.zeros((N, 6), "int32")
    for i, n in enumerate(rng.randint(2, 7, N)):
        target[i, 0], target[i, 1:n] = 1, rng.randint(2, 20, n - 1)  # 1 starts every target
    return {"source": source, "target_in": target[:, :-1]}, target[:, 1:], None


def _seq2seq():
    """A padded encoder-decoder: masks from both embeddings reach the GRUs and the loss."""
    source, target_in = keras.Input((6,), dtype="int32", name="source"), keras.Input((5,), dtype="int32",
                                                                                   name="target_in")
    _, state = keras.layers.GRU(4, return_state=True)(keras.layers.Embedding(20, 4, mask_zero=True)(source))
    decoded = keras.layers.GRU(4, return_sequences=True)(keras.layers.Embedding(20, 4, mask_zero=True)(target_in),
                                                         initial_state=state)
    return keras.Model({"source": source, "target_in": target_in}, keras.layers.Dense(20)(decoded))


def _tagger():
    return keras.Sequential([keras.Input((6,), dtype="int32"), keras.layers.Embedding(20, 4, mask_zero=True),
                             keras.layers.GRU(4, return_sequences=True), keras.layers.Dense(3)])


def _masked_sequences():
    x = _rng(4).rand(N, 5, 2).astype("float32")
    lengths = _rng(5).randint(1, 6, N)
    for i, n in enumerate(lengths):
        x[i, n:] = 0.0
    y = _rng(6).rand(N, 5, 1).astype("float32")
    return x, y, None


def _time_weighted():
    x, y, _ = _masked_sequences()
    return x, y, _rng(7).rand(N, 5).astype("float32")


def _timedistributed(mask: bool):
    layers = [keras.Input((5, 2))] + ([keras.layers.Masking(0.0)] if mask else [])
    return keras.Sequential(layers + [keras.layers.TimeDistributed(keras.layers.Dense(1))])


def _weighted_classes():
    x, y, _ = _classes()
    return x, y, np.where(y == 0, 0.01, 1.0).astype("float32")


def _two_outputs():
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(4, activation="relu")(inputs)
    model = keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(hidden),
                                 "b": keras.layers.Dense(3, name="b")(hidden)})
    model.compile(keras.optimizers.SGD(0.1), loss={"a": "mse", "b": keras.losses.SparseCategoricalCrossentropy(
        from_logits=True)}, loss_weights={"a": 1.0, "b": 0.5}, metrics={"a": ["mae"], "b": ["accuracy"]})
    return model


def _two_output_data():
    x, y, _ = _regression()
    return x, {"a": y, "b": (x[:, :3].argmax(axis=1)).astype("int32")}, None


def _dict_inputs():
    """A model built on a dict of Inputs, keyed otherwise than the Inputs are named and not in sorted order."""
    inputs = {"size": keras.Input((3,), name="size_feature"), "age": keras.Input((2,), name="age_feature")}
    hidden = keras.layers.Concatenate()([keras.layers.Dense(2)(inputs["size"]), inputs["age"]])
    return _compiled(keras.Model(inputs, keras.layers.Dense(1)(hidden)), metrics=["mae"])


def _list_inputs():
    inputs = [keras.Input((3,), name="size"), keras.Input((2,), name="age")]
    return _compiled(keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Concatenate()(inputs))), metrics=["mae"])


def _columns(*extra):
    """A dict of columns, as a CSV or a DataFrame gives them: the model's (in another order) and `extra` ones."""
    x, y, _ = _regression()
    columns = {"age": x[:, 3:], "size": x[:, :3]}
    columns.update({name: _rng(3).rand(N, 4).astype("float32") for name in extra})
    return columns, y, None


def _vectorized_text():
    vocabulary = ["the", "cat", "dog", "sat", "ran", "on", "mat"]
    model = keras.Sequential([keras.Input((), dtype="string"),
                              keras.layers.TextVectorization(vocabulary=vocabulary, output_sequence_length=4),
                              keras.layers.Embedding(len(vocabulary) + 2, 3), keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(1)])
    return _compiled(model, metrics=["mae"])


def _sentences():
    rng = _rng(7)
    words = np.array(["the", "cat", "dog", "sat", "ran", "on", "mat", "fox"])
    x = np.array([" ".join(rng.choice(words, rng.randint(1, 6))) for _ in range(N)], dtype=object)
    return x, np.array([[len(s) / 10.0] for s in x], "float32"), None


class BagOfWords(keras.Model):
    """The mean embedding of each example's own tokens, from a ragged batch of token ids (subclassed: Keras 3.8's
    Input has no ragged=True)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.embedding, self.head = keras.layers.Embedding(20, 4), keras.layers.Dense(1)

    def call(self, ids):
        import tensorflow as tf

        return self.head(tf.reduce_mean(self.embedding(ids), axis=1))


def _ragged_bag_of_words():
    return _compiled(BagOfWords(), metrics=["mae"])


def _token_ids():
    """Each example a list of 1 to 5 token ids, as a tf.RaggedTensor given as x (not in a dataset)."""
    import tensorflow as tf

    rng = _rng(8)
    ids = [list(rng.randint(1, 20, rng.randint(1, 6))) for _ in range(N)]
    return tf.ragged.constant(ids, dtype=tf.int64), np.array([[len(i) / 5.0] for i in ids], "float32"), None


def _sparse_features():
    """Bag-of-words counts over 12 words, mostly zeros, as a tf.SparseTensor given as x."""
    import tensorflow as tf

    rng = _rng(9)
    counts = ((rng.rand(N, 12) < 0.2) * rng.randint(1, 4, (N, 12))).astype("float32")
    return tf.sparse.from_dense(counts), (counts @ rng.rand(12, 1) / 4).astype("float32"), None


class ExamplesSeen(keras.layers.Layer):
    """Counts the examples it trains on in a variable summed over replicas, and scales its input by the count,
    so that the count reaches the loss, the weights and the predictions."""

    def build(self, input_shape):
        self.seen = self.add_weight(shape=(), initializer="zeros", trainable=False, aggregation="sum", name="seen")

    def call(self, x, training=False):
        if training:
            self.seen.assign_add(ops.cast(ops.shape(x)[0], self.seen.dtype))
        return x * (1.0 + 0.01 * self.seen)


def _counting():
    return _compiled(keras.Sequential([keras.Input((5,)), ExamplesSeen(), keras.layers.Dense(4, activation="relu"),
                                       keras.layers.Dense(1)]), metrics=["mae"])


def _classifier():
    return _compiled(_dense(3), keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])


CASES: dict[str, Case] = {
    "dense_l2_mae": Case(lambda: _compiled(_dense(kernel_regularizer="l2"), metrics=["mae"]), _regression),
    "class_weighted_loss": Case(lambda: _compiled(_dense(3), keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"]), _weighted_classes),
    "activity_regularizer": Case(lambda: _compiled(_dense(activity_regularizer=keras.regularizers.L2(0.1))),
                                 _regression),
    "add_loss_mean": Case(lambda: _compiled(keras.Sequential([keras.Input((5,)), keras.layers.Dense(4),
                                                              MeanPenalty(), keras.layers.Dense(1)])),
                          _regression),
    "masking_timedistributed": Case(lambda: _compiled(_timedistributed(True), metrics=["mae"]), _masked_sequences),
    "embedding_mask_zero_tagger": Case(lambda: _compiled(_tagger(), keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"]), _padded_tokens),
    # On several replicas the masks' counts are all-reduced in the forward pass: XLA goes off, and says so.
    "embedding_mask_zero_xla": Case(lambda: _compiled(_tagger(), keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"], jit_compile=True), _padded_tokens),
    "padded_seq2seq": Case(lambda: _compiled(_seq2seq(), keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), metrics=["accuracy"]), _padded_pairs),
    "per_timestep_sample_weight": Case(lambda: _compiled(_timedistributed(False), weighted_metrics=["mae"]),
                                       _time_weighted),
    "two_outputs_dict": Case(_two_outputs, _two_output_data),
    "metric_names": Case(lambda: _compiled(_dense(1, "sigmoid"), "binary_crossentropy",
                                           metrics=["mae", "precision", "acc"]), _binary, validation=True),
    "custom_loss_and_metric_unregistered": Case(
        lambda: _compiled(_dense(3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=[CategoricalTruePositives()]), _class_column),
    "custom_loss_class_unregistered": Case(lambda: _compiled(_dense(), CustomMSE()), _regression),
    "plain_loss_function": Case(lambda: _compiled(_dense(), plain_loss, metrics=[plain_loss]), _regression),
    "early_stopping_val_mae": Case(
        lambda: _compiled(_dense(), metrics=["mae"]), _regression, validation=True,
        callbacks=lambda: [keras.callbacks.EarlyStopping(monitor="val_mae", patience=0, min_delta=10.0)]),
    "checkpoint_best_val_accuracy": Case(
        lambda: _compiled(_dense(3), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"]), _classes, validation=True,
        callbacks=lambda: [keras.callbacks.ModelCheckpoint("{tmp}/best.keras", monitor="val_accuracy",
                                                           save_best_only=True)]),
    "train_step_guide_custom_model": Case(
        lambda: _compiled(_guide_model(), metrics=["mae"]), _regression,
        per_replica={"loss": "its loss tracker averages each replica's mean loss unweighted, as under Keras's "
                             "own fit with a strategy; the uneven last batch's replicas then count alike"}),
    "own_steps_no_compiled_loss": Case(lambda: _compiled(LowLevelModel(), loss=None), _regression),
    "compute_loss_penalty": Case(lambda: _compiled(PenaltyModel(_dense().layers), metrics=["mae"]), _regression),
    "test_step_override": Case(lambda: _compiled(HalfTestLossModel(_dense().layers), metrics=["mae"]), _regression,
                               validation=True),
    "compute_metrics_override": Case(lambda: _compiled(ExtraMetricModel(_dense().layers), metrics=["mae"]),
                                     _regression),
    "train_step_returns_loss_tensors": Case(lambda: _compiled(RawLossesModel(), loss=None), _regression,
                                            validation=True),
    "gan_two_optimizers": Case(_gan, lambda: (_regression()[0], _regression()[0][:, :1], None), evaluate=False),
    # Optimizer options: clipping acts on the global gradient (Keras's own fit under a strategy
    # clips each replica's), and the options that update inside a `cond` work on every layout.
    "clipnorm": Case(lambda: _compiled(_dense(), optimizer=_sgd(clipnorm=0.05)), _regression,
                     keras_differs_on_replicas=True),
    "global_clipnorm": Case(lambda: _compiled(_dense(), optimizer=_sgd(global_clipnorm=0.05)), _regression,
                            keras_differs_on_replicas=True),
    "clipvalue": Case(lambda: _compiled(_dense(), optimizer=_sgd(clipvalue=0.01)), _regression,
                      keras_differs_on_replicas=True),
    # A layer's count of the examples seen, summed over replicas (Keras's own fit under a strategy sums each
    # replica's whole new value: R * old + the updates).
    "examples_seen_summed": Case(_counting, _regression, keras_differs_on_replicas=True),
    "gradient_accumulation": Case(lambda: _compiled(_dense(), optimizer=keras.optimizers.Adam(
        0.01, gradient_accumulation_steps=3, global_clipnorm=0.5)), _regression),
    "ema_overwrite": Case(lambda: _compiled(_dense(), optimizer=_sgd(
        use_ema=True, ema_momentum=0.5, ema_overwrite_frequency=3)), _regression),
    "ema_final_weights": Case(lambda: _compiled(_dense(), optimizer=keras.optimizers.Adam(
        0.01, use_ema=True, ema_momentum=0.5)), _regression),
    "train_step_global_clipnorm": Case(
        lambda: _compiled(_guide_model(), metrics=["mae"], optimizer=_sgd(global_clipnorm=0.05)), _regression,
        per_replica={"loss": "its loss tracker averages each replica's mean loss unweighted (see the row above)"}),
    "train_step_gradient_accumulation": Case(
        lambda: _compiled(_guide_model(), metrics=["mae"], optimizer=_sgd(gradient_accumulation_steps=2)),
        _regression,
        per_replica={"loss": "its loss tracker averages each replica's mean loss unweighted (see the row above)"}),
    # Input forms: the same data as a batched tf.data.Dataset, a generator or a PyDataset.
    "batched_dataset": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression, form="dataset",
                            validation=True),
    "batched_dataset_drop_remainder": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression,
                                           form="dataset_drop_remainder"),
    "batched_dataset_reshuffled": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression,
                                       form="dataset_reshuffled"),
    "batched_dataset_weighted_classes": Case(_classifier, _weighted_classes, form="dataset"),
    "generator": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression, form="generator"),
    # Data of unknown size: model.fit's call past its end moves Adam's step count and Dropout's seed on, each
    # epoch, with no batch (trainer/engine/past_end.py).
    "dataset_unknown_size_adam_dropout": Case(
        lambda: _compiled(keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                                            keras.layers.Dropout(0.3), keras.layers.Dense(1)]),
                          metrics=["mae"], optimizer=keras.optimizers.Adam(0.01)),
        _regression, form="dataset_unknown_size", validation=True),
    "pydataset_workers": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression, form="pydataset_workers"),
    "string_inputs": Case(_vectorized_text, _sentences),
    "string_dataset": Case(_vectorized_text, _sentences, form="dataset"),
    # A dict of columns for the model's inputs, taken by name as Keras takes it; keys beyond the inputs are
    # ignored (Keras warns that the structures differ for a model built on a dict, and feeds its values in
    # sorted key order: here the extra keys sort after the inputs'; test_bad_input has keys that sort among them).
    "dict_inputs_by_key": Case(_dict_inputs, _columns),
    # Token ids of different lengths, a tf.RaggedTensor given as x, as model.fit takes it (issue 51).
    "ragged_token_ids": Case(_ragged_bag_of_words, _token_ids),
    # Sparse features, a tf.SparseTensor given as x: its Dense gives sparse gradients (issue 51).
    "sparse_features": Case(lambda: _compiled(keras.Sequential([keras.Input((12,), sparse=True), keras.layers.Dense(3),
                                                                keras.layers.Dense(1)]), metrics=["mae"]),
                            _sparse_features),
    "dict_inputs_more_columns": Case(_dict_inputs, lambda: _columns("weight", "zip")),
    "list_inputs_columns_by_name": Case(_list_inputs, lambda: _columns("0_index")),
    # fit's Keras arguments.
    "class_weight": Case(_classifier, _classes, fit_kwargs={"class_weight": {0: 0.5, 2: 3.0}}),
    "class_weight_pydataset": Case(_classifier, _classes, form="pydataset_workers",
                                   fit_kwargs={"class_weight": {1: 2.0}}),
    "validation_split": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression,
                             fit_kwargs={"validation_split": 0.3}),
    "validation_data_wins_over_split": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression,
                                            validation=True, fit_kwargs={"validation_split": 0.3}),
    "validation_freq_and_steps": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression, validation=True,
                                      fit_kwargs={"validation_freq": 2, "validation_steps": 1,
                                                  "validation_batch_size": 4}),
    "compile_steps_per_execution": Case(lambda: _compiled(_dense(), metrics=["mae"], steps_per_execution=3),
                                        _regression),
    "compile_jit_compile": Case(lambda: _compiled(_dense(), metrics=["mae"], jit_compile=True), _regression),
    # steps_per_epoch as Keras's epoch iterator counts it (trainer/data/passes.py): one stream whose pass's end ends an
    # epoch (4 batches in epochs of 3 read 3, 1, 3, 1; in epochs of 6, 4 each), and calls of steps_per_execution
    # that run past it (epochs of 1 with calls of 2 read 2).
    "steps_per_epoch_below_the_arrays": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression,
                                             fit_kwargs={"steps_per_epoch": 3, "epochs": 4}),
    "steps_per_epoch_below_a_dataset": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression,
                                            form="dataset", fit_kwargs={"steps_per_epoch": 3, "epochs": 4}),
    "steps_per_epoch_beyond_a_dataset": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression,
                                             form="dataset", fit_kwargs={"steps_per_epoch": 6, "epochs": 3}),
    "steps_per_execution_past_steps_per_epoch": Case(
        lambda: _compiled(_dense(), metrics=["mae"], steps_per_execution=2), _regression,
        fit_kwargs={"steps_per_epoch": 1, "epochs": 3}),
    # evaluate's and predict's Keras arguments (every row also compares evaluate's default return: a list or
    # a float).
    "evaluate_predict_steps": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression,
                                   eval_kwargs={"steps": 2}),
    "evaluate_predict_steps_dataset": Case(lambda: _compiled(_dense(), metrics=["mae"]), _regression,
                                           form="dataset", eval_kwargs={"steps": 2}),
    # Features alone, no y: `model.fit(x)` for models whose own steps or losses need no targets.
    "features_only_gan": Case(_gan, _features_only, evaluate=False),
    "features_only_gan_dataset": Case(_gan, _features_only, evaluate=False, form="dataset"),
    # Models that can't be re-created from a config, trained in place (issue 32).
    "vae_no_call": Case(_vae, _features_only, evaluate=False, predict=False,
                        per_replica={key: "its trackers average each replica's mean loss unweighted, as under "
                                          "Keras's own fit with a strategy" for key in
                                     ("loss", "reconstruction_loss", "kl_loss")}),
    "distiller_teacher_in_compute_loss": Case(_distiller, _classes),
    "custom_objects_with_required_arguments": Case(
        lambda: _compiled(_dense(), RequiredArgumentMSE(2.0), metrics=[WithinTolerance(0.5)]), _regression),
    "lambda_layer": Case(lambda: _compiled(_lambda_model(), metrics=["mae"]), _regression),
    "fitted_twice": Case(lambda: _compiled(_dense(), metrics=["mae"], optimizer=keras.optimizers.Adam(0.01)),
                         _regression, fits=2),
    "saved_and_reloaded": Case(lambda: _compiled(_dense(), metrics=["mae"], optimizer=keras.optimizers.Adam(0.01)),
                               _regression, reload=True),
    # Random layers: each replica draws its rows of the draw one device makes for the global batch.
    "dropout_noise_layers": Case(lambda: _compiled(keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.3),
        keras.layers.GaussianNoise(0.2), keras.layers.AlphaDropout(0.2), keras.layers.Dense(1)]), metrics=["mae"]),
        _regression, validation=True),
    "random_layers_xla": Case(lambda: _compiled(keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dropout(0.3),
        keras.layers.GaussianNoise(0.2), keras.layers.Dense(1)]), metrics=["mae"], jit_compile=True), _regression),
    "image_augmentation_spatial_dropout": Case(lambda: _compiled(keras.Sequential([
        keras.Input((8, 8, 3)), keras.layers.RandomFlip(), keras.layers.RandomRotation(0.2),
        keras.layers.RandomTranslation(0.1, 0.1), keras.layers.RandomZoom(0.1), keras.layers.RandomContrast(0.2),
        keras.layers.Conv2D(4, 3, activation="relu"), keras.layers.SpatialDropout2D(0.25),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3)]),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]), _images),
    "gan_random_noise": Case(lambda: _gan(noise=True), lambda: (_regression()[0], _regression()[0][:, :1], None),
                             evaluate=False),
    "mixed_random_and_batch_norm": Case(lambda: _compiled(keras.Sequential([
        keras.Input((8, 8, 3)), keras.layers.RandomFlip("horizontal"),
        # No bias before BatchNormalization: its gradient is zero but for rounding, so it holds only rounding.
        keras.layers.Conv2D(4, 3, use_bias=False), keras.layers.BatchNormalization(), keras.layers.ReLU(),
        keras.layers.Dropout(0.2),
        keras.layers.GlobalAveragePooling2D(), keras.layers.GaussianNoise(0.1), keras.layers.Dense(3)]),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]), _images,
        validation=True),
    # BatchNormalization: the global batch's statistics on every layout (Trainer(batch_norm="global")).
    "batch_norm_momentum": Case(lambda: _compiled(_batch_norm_dense(), metrics=["mae"],
                                                  optimizer=_sgd(momentum=0.9)), _regression, validation=True),
    "batch_norm_own_train_step": Case(
        lambda: _compiled(_guide_model(batch_norm=True), metrics=["mae"]), _regression,
        per_replica={"loss": "its loss tracker averages each replica's mean loss unweighted (see the row above)"}),
    # keras.io's endpoint layer: a Loss object's value computed in the forward pass, handed to add_loss.
    "endpoint_layer_loss": Case(_endpoint, _inputs_and_targets),
    "features_only_add_loss": Case(lambda: _compiled(keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(4), MeanPenalty(), keras.layers.Dense(1)]), loss=None), _features_only),
}


def _sgd(**options):
    return keras.optimizers.SGD(0.1, **options)


def _guide_model(batch_norm=False):
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(4, activation="relu")(inputs)
    if batch_norm:
        hidden = keras.layers.BatchNormalization()(hidden)
    return GuideCustomModel(inputs, keras.layers.Dense(1)(hidden))


def _batch_norm_dense():
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, use_bias=False),
                             keras.layers.BatchNormalization(), keras.layers.Dense(1)])



RTOL, ATOL = 1e-5, 1e-6


def close(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and np.allclose(a, b, rtol=RTOL, atol=ATOL)


def compare(reference, result, case: Case, replicas: int, excused: frozenset[str] = frozenset()) -> list[str]:
    """What differs between model.fit's (history, weights, evaluate, predict) and the trainer's, in words.

    The values of the `excused` names (where Keras is wrong: "a_loss") are not compared, in history (with their
    `val_` names), in evaluate's dict, nor in evaluate's list (`"default"`), whose entries are named by the
    reference's dict: an entry equal to an excused name's value is that name's."""
    (ref_hist, ref_w, ref_ev, ref_pred), (hist, w, ev, pred) = reference, result
    excused = excused | {f"val_{name}" for name in excused}
    problems = []
    if len(ref_w) != len(w):
        problems.append(f"model.fit's model holds {len(ref_w)} weights and stepped optimizers' variables, "
                        f"the trainer's {len(w)}")
    if set(ref_hist) != set(hist):
        problems.append(f"history keys: model.fit {sorted(ref_hist)}, trainer {sorted(hist)}")
    for key, values in ref_hist.items():
        if replicas > 1 and key in case.per_replica:
            if key not in hist or not np.allclose(values, hist[key], rtol=0.1):
                problems.append(f"history[{key!r}] is not even close: {values} vs {hist.get(key)}")
        elif key not in hist:
            problems.append(f"history lacks {key!r} (has {sorted(hist)})")
        elif key in excused:
            continue
        elif not close(values, hist[key]):
            problems.append(f"history[{key!r}]: model.fit {values}, trainer {hist[key]}")
    if len(ref_w) != len(w) or not all(close(a, b) for a, b in zip(ref_w, w)):
        problems.append("final weights differ")
    for key, value in ref_ev.items():
        if key not in ev:
            problems.append(f"evaluate lacks {key!r} (has {sorted(ev)})")
        elif key in excused:
            continue
        elif key == "default" and excused and isinstance(value, list):
            named = [name for name in excused if name in ref_ev]
            kept = [i for i, entry in enumerate(value)
                    if not any(np.isclose(entry, ref_ev[name], rtol=1e-6, atol=0) for name in named)]
            assert len(kept) < len(value), f"no entry of evaluate's list {value} is one of {sorted(excused)}"
            if len(value) != len(ev[key]) or not close([value[i] for i in kept], [ev[key][i] for i in kept]):
                problems.append(f"evaluate['default'] without {sorted(excused)}: model.evaluate {value}, "
                                f"trainer {ev[key]}")
        elif not close(value, ev[key]):
            problems.append(f"evaluate[{key!r}]: model.evaluate {value}, trainer {ev[key]}")
    if ref_pred is None and pred is None:  # a row that does not predict
        return problems
    ref_flat, flat = keras.tree.flatten(ref_pred), keras.tree.flatten(pred)
    if len(ref_flat) != len(flat) or not all(close(a, b) for a, b in zip(ref_flat, flat)):
        problems.append("predict differs")
    return problems
