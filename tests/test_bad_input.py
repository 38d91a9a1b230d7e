"""Bad input fails fast and clearly, before anything changes.

Every row is a call with one bad input. It must raise ValueError or TypeError
(exit status 2 for the command lines) whose message names the argument, shows
the value received and says how to fix it; the error must come from our code,
not from TensorFlow; and the model's weights and optimizer, and the files in
the test's directory, must be as they were.
"""

import json
import os
import re
import sys
import traceback
import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.callbacks import (BackupAndRestore, CSVLogger, JSONLogger, ModelCheckpoint, PlotHistory, ProgressBar,
                               TensorBoard)
from conftest import TESTS, mirrored, tiny_data, tiny_model
from trainer import Trainer, _compat
from trainer.launch import launcher as launch

sys.path.insert(0, str(TESTS.parent / "examples"))
import fashion_mnist  # noqa: E402

REPO = str(TESTS.parent)
CLI = SystemExit  # rows whose call is a command line: exit status 2 and the message on stderr


def named_inputs_model():
    inputs = {"a": keras.Input((4,), name="a"), "b": keras.Input((4,), name="b")}
    merged = keras.layers.Concatenate()([inputs["a"], inputs["b"]])
    model = keras.Model(inputs, keras.layers.Dense(3)(merged))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def stateful_model():
    """A stateful RNN, whose fixed batch of 8 every step must take."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(batch_shape=(8, 4, 2)), keras.layers.SimpleRNN(3, stateful=True),
                              keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def two_output_model():
    inputs = keras.Input((8,))
    model = keras.Model(inputs, [keras.layers.Dense(3, name="a")(inputs), keras.layers.Dense(3, name="b")(inputs)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _sequences(c):
    return c.x.reshape(-1, 4, 2)


def _check_workers(x, num_workers, parameter_server=False, shuffle=False):
    """fit's check of a Python-fed input on several workers (no strategy is built)."""
    def call(c):
        from trainer.data import boundary as data

        inp = data.as_input(x(c), arg="data", shuffle=shuffle)
        data.check_workers(inp, num_workers, parameter_server=parameter_server, arg="data")
    return call


def _train_on_batch_of_a_scalar(c):
    """`train_on_batch` on one number, inside Trainer.distribute()."""
    with Trainer(strategy="default", verbose=0).distribute():
        c.model.train_on_batch(np.float32(1.0), c.y[:1])


def _inside_another_scope(c):
    """A call inside the scope of a strategy that is not the Trainer's."""
    with mirrored(2).scope():
        Trainer(strategy="one_device", verbose=0).fit(c.model, c.x, c.y)


def uncompiled_model():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])


def lossless_model():
    model = uncompiled_model()
    model.compile("sgd")  # no loss, and no layer adds one
    return model


def _fit(c, data=None, trainer=None, **kwargs):
    trainer = trainer or Trainer(strategy="default", verbose=0)
    return trainer.fit(c.model, (c.x, c.y) if data is None else data, **kwargs)


def c_fit_keras(c, x, y, **kwargs):
    """fit as a model.fit script calls it: x and y apart."""
    return Trainer(strategy="default", verbose=0).fit(c.model, x, y, **kwargs)


def _batches(x, y, size=8):
    return ((x[i:i + size], y[i:i + size]) for i in range(0, len(x), size))


class _PyBatches(keras.utils.PyDataset):
    def __init__(self, x, y, endless=False):
        super().__init__()
        self.x, self.y, self.endless = x, y, endless

    @property
    def num_batches(self):
        return None if self.endless else -(-len(self.x) // 8)

    def __getitem__(self, i):
        i %= -(-len(self.x) // 8)
        return self.x[i * 8:(i + 1) * 8], self.y[i * 8:(i + 1) * 8]


def _ds(*parts):
    return tf.data.Dataset.from_tensor_slices(parts if len(parts) > 1 else parts[0])


def _tf_config(value, strategy="auto"):
    def call(c):
        c.monkeypatch.setenv("TF_CONFIG", value if isinstance(value, str) else json.dumps(value))
        Trainer(strategy=strategy, verbose=0)
    return call


def _cli(main, *argv):
    return lambda c: main([a.format(tmp=c.tmp, file=c.a_file) for a in argv])


TWO_WORKERS = {"worker": ["localhost:1", "localhost:2"]}


def _keras_backup_on_two_workers(c):
    """fit's checks on a worker of two (TF_CONFIG is read by the checks; no strategy is built)."""
    from trainer import checks

    checks.check_callbacks_on_workers([keras.callbacks.BackupAndRestore(str(c.tmp / "backup"))], num_workers=2)

# (id, call, error, argument, value as shown, fix) and, optionally, what makes the model the call gets
# (a model, or a builder that fit calls).
ROWS = [
    # Trainer(...)
    ("per-replica-batch-0", lambda c: Trainer(per_replica_batch_size=0), ValueError,
     "`per_replica_batch_size`", "per_replica_batch_size=0", r"Pass a positive number of examples"),
    ("batch-negative", lambda c: Trainer(batch_size=-8), ValueError, "`batch_size`", "batch_size=-8",
     r"Pass a positive number"),
    ("batch-float", lambda c: Trainer(batch_size=32.0), TypeError, "`batch_size`", "batch_size=32.0",
     r"Pass a positive number"),
    ("batch-string", lambda c: Trainer(per_replica_batch_size="32"), TypeError, "`per_replica_batch_size`",
     "per_replica_batch_size='32'", r"Pass a positive number"),
    ("both-batch-arguments", lambda c: Trainer(per_replica_batch_size=8, batch_size=64), ValueError,
     "`per_replica_batch_size`", "batch_size=64", r"batch_size fixes it"),
    ("data-sharding-unknown", lambda c: Trainer(data_sharding="file"), ValueError, "`data_sharding`",
     "data_sharding='file'", r"Pass 'exact'"),
    ("file-shards-0", lambda c: Trainer(file_shards=0), ValueError, "`file_shards`", "file_shards=0",
     r"Pass a positive number of file shards"),
    ("lr-scaling", lambda c: Trainer(lr_scaling="cubic"), ValueError, "`lr_scaling`", "lr_scaling='cubic'",
     r"Pass 'auto'"),
    ("warmup-negative", lambda c: Trainer(warmup_steps=-1), ValueError, "`warmup_steps`", "warmup_steps=-1",
     r"Pass 0 for no warmup"),
    ("warmup-both", lambda c: Trainer(warmup_epochs=1, warmup_steps=5), ValueError, "`warmup_epochs`",
     "warmup_steps=5", r"Set the other one to 0"),
    ("steps-per-execution", lambda c: Trainer(steps_per_execution=0), ValueError, "`steps_per_execution`",
     "steps_per_execution=0", r"Pass a positive integer, or 'auto'"),
    ("jit-compile", lambda c: Trainer(jit_compile="yes"), ValueError, "`jit_compile`", "jit_compile='yes'",
     r"Pass 'auto'"),
    ("seed-text", lambda c: Trainer(seed="0"), TypeError, "`seed`", "seed='0'", r"Pass a non-negative integer"),
    ("nan-guard-text", lambda c: Trainer(nan_guard="yes"), TypeError, "`nan_guard`", "nan_guard='yes'",
     r"Pass nan_guard=True or nan_guard=False"),
    ("warmup-text", lambda c: Trainer(warmup_epochs="2"), TypeError, "`warmup_epochs`", "warmup_epochs='2'",
     r"Pass e.g. warmup_epochs=2"),
    ("batch-norm-typo", lambda c: Trainer(batch_norm="sync"), ValueError, "`batch_norm`", "batch_norm='sync'",
     r"Pass 'global' \(the one-device statistics"),
    ("mixed-precision-typo", lambda c: Trainer(mixed_precision="fp16"), ValueError, "`mixed_precision`",
     "mixed_precision='fp16'", r"Use 'mixed_float16' on GPUs"),
    ("seed-negative", lambda c: Trainer(seed=-1), ValueError, "`seed`", "seed=-1", r"Pass a non-negative integer"),
    ("strategy-typo", lambda c: Trainer(strategy="mirorred"), ValueError, "`strategy`", "strategy='mirorred'",
     r"Did you mean 'mirrored'\?"),
    ("strategy-type", lambda c: Trainer(strategy=3), TypeError, "`strategy`", "strategy=3", r"Pass one of auto"),
    ("strategy-typo-in-fit", lambda c: _fit(c, strategy="gpu"), ValueError, "`strategy`", "strategy='gpu'",
     r"Pass one of those names"),
    ("tpu-unreachable", lambda c: _fit(c, trainer=Trainer(strategy="tpu", verbose=0)), ValueError, "`strategy",
     "strategy='tpu'", r"Run on a TPU VM \(or set TPU_NAME\), or pick another strategy"),
    # TF_CONFIG, read before TensorFlow reads it
    ("tf-config-not-json", _tf_config("{not json"), ValueError, "`TF_CONFIG`", "TF_CONFIG='{not json'",
     r"unset it to train on one machine"),
    ("tf-config-no-cluster", _tf_config({"task": {"type": "worker", "index": 0}}, "multi_worker"), ValueError,
     "`TF_CONFIG`", '"task": {"type": "worker"', r"Add the cluster"),
    ("tf-config-task-type", _tf_config({"cluster": TWO_WORKERS, "task": {"type": "chief", "index": 0}}),
     ValueError, "`TF_CONFIG`", "task type 'chief'", r"Set task.type to one of those"),
    ("tf-config-index", _tf_config({"cluster": TWO_WORKERS, "task": {"type": "worker", "index": 2}},
                                   "multi_worker"), ValueError, "`TF_CONFIG`", "task index 2",
     r"Set task.index within it"),
    ("tf-config-not-object", _tf_config("[1, 2]", "parameter_server"), ValueError, "`TF_CONFIG`",
     "TF_CONFIG='[1, 2]'", r"unset it"),
    # fit's loop arguments and warmup
    ("epochs-float", lambda c: _fit(c, epochs=2.5), TypeError, "`epochs`", "epochs=2.5", r"Pass the epoch"),
    ("callback-not-a-callback", lambda c: _fit(c, callbacks=[keras.callbacks.History(), object()]), TypeError,
     "`callbacks[1]`", "<object object at", r"Subclass keras.callbacks.Callback"),
    ("evaluate-callback-not-a-callback", lambda c: Trainer(strategy="default", verbose=0).evaluate(
        c.model, (c.x, c.y), callbacks=["log"]), TypeError, "`callbacks[0]`", "'log' of type str",
     r"Subclass keras.callbacks.Callback"),
    ("warmup-steps-beyond-training",
     lambda c: _fit(c, trainer=Trainer(strategy="default", batch_size=32, warmup_steps=1000, verbose=0), epochs=2),
     ValueError, "`warmup_steps`", "warmup_steps=1000", r"Lower it to at most 14 steps, or train for more epochs"),
    ("warmup-epochs-beyond-training",
     lambda c: _fit(c, trainer=Trainer(strategy="default", batch_size=32, warmup_epochs=5, verbose=0), epochs=2),
     ValueError, "`warmup_epochs`", "warmup_epochs=5", r"Lower it to at most 14 steps"),
    # fit's data: arrays
    ("feature-shape", lambda c: _fit(c, (c.x[:, :5], c.y)), ValueError, "`data` x", "(203, 5)",
     r"Reshape the data, or build the model with keras.Input\(\(5,\)\)"),
    ("feature-shape-builder", lambda c: _fit(c, (c.x[:, :5], c.y)), ValueError, "`data` x", "(203, 5)",
     r"Reshape the data", lambda: tiny_model),
    ("string-features", lambda c: _fit(c, (c.x.astype(str), c.y)), TypeError, "`data` x", "text (strings)",
     r"x.astype\('float32'\)"),
    ("object-array", lambda c: _fit(c, (np.array([np.ones(8)] * 3 + [np.ones(7)], dtype=object), c.y[:4])),
     TypeError, "`data` x", "dtype=object", r"Pad the rows to one length"),
    ("ragged-list", lambda c: _fit(c, ([[1.0] * 8, [1.0] * 7], c.y[:2])), TypeError, "`data` x",
     "[1.0, 1.0, 1.0", r"np.asarray"),
    ("labels-too-large", lambda c: _fit(c, (c.x, c.y + 1)), ValueError, "`data` y", "max=3",
     r"Use labels 0..2, or give the last layer one unit per class"),
    ("labels-negative", lambda c: _fit(c, (c.x, c.y - 1)), ValueError, "`data` y", "min=-1", r"Use labels 0..2"),
    ("string-labels", lambda c: _fit(c, (c.x, c.y.astype(str))), TypeError, "`data` y", "dtype=<U",
     r"Encode the labels as integers"),
    *([("dict-key-among-the-inputs", lambda c: _fit(c, ({"a": c.x[:, :4], "aa": c.x[:, 4:], "b": c.x[:, 4:]}, c.y)),
        ValueError, "`data` x", "x['aa'] to input 'b'", r"Keep only the inputs' keys", named_inputs_model)]
      if _compat.KERAS_VERSION < (3, 16) else []),  # Keras 3.16 feeds a dict by key: test_dict_inputs.py
    ("sequential-dict-other-key", lambda c: _fit(c, ({"other": c.x}, c.y)), ValueError, "`data` x",
     "x with keys ['other']", r"rename the keys to match"),
    ("missing-dict-key", lambda c: _fit(c, ({"a": c.x[:, :4], "c": c.x[:, 4:]}, c.y)), ValueError, "`data` x",
     "missing: ['b']", r"The model's inputs are \['a', 'b'\]: rename the keys", named_inputs_model),
    ("lengths-differ", lambda c: _fit(c, (c.x, c.y[:-1])), ValueError, "`data`", "[203, 202]",
     r"Make x, y and sample_weight the same length"),
    ("sample-weight-length", lambda c: _fit(c, (c.x, c.y, c.w[:10])), ValueError, "`data`", "[203, 203, 10]",
     r"Make x, y and sample_weight the same length"),
    ("sample-weight-rank-3", lambda c: _fit(c, (c.x, c.y, np.ones((203, 4, 2), np.float32))), ValueError,
     "`data`'s sample_weight", "shape (203, 4, 2)", r"Weight the examples or their time steps"),
    ("sample-weight-dict", lambda c: _fit(c, (c.x, c.y, {"out": c.w})), ValueError, "`data`'s sample_weight",
     "a dict", r"Weight the examples"),
    ("empty-arrays", lambda c: _fit(c, (c.x[:0], c.y[:0])), ValueError, "`data`", "0 examples",
     r"Pass arrays with at least one row"),
    ("features-only-for-a-compiled-loss", lambda c: _fit(c, c.x), ValueError, "`data`", "arrays with no y",
     r"Pass the targets: fit\(model, x, y\), or data=\(x, y\)"),
    ("features-only-dataset-for-a-compiled-loss", lambda c: _fit(c, tf.data.Dataset.from_tensor_slices(
        {"image": c.x, "label": c.y})), ValueError, "`data`", "tf.data.Dataset with no y",
     r"Make the tf.data.Dataset yield \(x, y\) elements"),
    ("class-weight-without-targets", lambda c: c_fit_keras(c, c.x, None, class_weight={0: 2.0}), ValueError,
     "`class_weight`", "class_weight={0: 2.0}", r"Pass the targets"),
    ("not-data", lambda c: _fit(c, 3), TypeError, "`data`", "data=3", r"Pass the data"),
    ("scalar-arrays", lambda c: _fit(c, (np.float32(1.0), np.int64(0))), ValueError, "`data`", "shapes [()",
     r"Pass arrays with one row per example"),
    ("callbacks-a-string", lambda c: _fit(c, callbacks="log"), TypeError, "`callbacks`", "callbacks='log'",
     r"Pass a list: callbacks=\[...\]"),
    ("stateful-batch-mismatch", lambda c: _fit(c, (_sequences(c)[:200], c.y[:200]),
                                               trainer=Trainer(strategy="default", batch_size=16, verbose=0)),
     ValueError, "`batch_size`", "a global batch of 16", r"Pass Trainer\(batch_size=8\)", stateful_model),
    ("stateful-partial-batch", lambda c: _fit(c, (_sequences(c)[:201], c.y[:201]),
                                              trainer=Trainer(strategy="default", batch_size=8, verbose=0)),
     ValueError, "multiple of 8", "201 examples", r"Drop the last 1 examples", stateful_model),
    ("stateful-on-replicas", lambda c: _fit(c, (_sequences(c)[:200], c.y[:200]),
                                            trainer=Trainer(strategy=mirrored(2), batch_size=8, verbose=0)),
     ValueError, "`model`", "2 replicas", r"Train it on one device", stateful_model),
    ("validation-split-empty-side", lambda c: _fit(c, validation_split=0.999), ValueError, "`validation_split`",
     "validation_split=0.999", r"leaves at least one example for training"),
    ("class-weight-multi-output", lambda c: _fit(c, (c.x, (c.y, c.y)), class_weight={0: 2.0}), ValueError,
     "`class_weight`", "2 outputs", r"Pass per-output sample_weight", two_output_model),
    ("generator-on-workers", _check_workers(lambda c: _batches(c.x, c.y), 2), ValueError, "generator",
     "`data` as a generator", r"keras.utils.PyDataset"),
    ("shuffled-pydataset-on-workers", _check_workers(lambda c: _PyBatches(c.x, c.y), 2, shuffle=True), ValueError,
     "PyDataset", "shuffle=True", r"Pass shuffle=False"),
    ("pydataset-under-parameter-server", _check_workers(lambda c: _PyBatches(c.x, c.y), 2, parameter_server=True),
     ValueError, "Parameter-server", "`data` as a PyDataset", r"Pass a tf.data.Dataset"),
    ("validation-shape", lambda c: _fit(c, validation_data=(c.x[:, :4], c.y)), ValueError, "`validation_data`",
     "(4,)", r"Pass validation arrays shaped like the training arrays"),
    ("validation-structure-dict", lambda c: _fit(c, validation_data=({"a": c.x}, c.y)), ValueError,
     "`validation_data`", "{'a': (8,)}", r"Pass validation arrays shaped like the training arrays"),
    # fit's data: datasets (structure and cardinality only; they are never scanned)
    ("dataset-one-component", lambda c: _fit(c, _ds(c.x)), ValueError, "`data`", "float32[8]",
     r"Make the tf.data.Dataset yield \(x, y\) elements"),
    ("dataset-four-components", lambda c: _fit(c, _ds(c.x, c.y, c.w, c.w)), ValueError, "`data`",
     "'float32[8]', 'int64[]', 'float32[]', 'float32[]'", r"Map each element to a tuple"),
    ("dataset-infinite", lambda c: _fit(c, _ds(c.x, c.y).repeat()), ValueError, "`data`",
     "cardinality INFINITE, steps_per_epoch=None", r"Pass steps_per_epoch=<steps>, or drop .repeat\(\)"),
    ("validation-infinite", lambda c: _fit(c, validation_data=_ds(c.x, c.y).repeat()), ValueError,
     "`validation_data`", "cardinality INFINITE", r"validation_data.take\("),
    # fit's data: batched datasets, generators, PyDatasets (checked on their element specs and first batches)
    ("batched-feature-shape", lambda c: _fit(c, _ds(c.x[:, :5], c.y).batch(8, drop_remainder=True)), ValueError,
     "`data` x", "per-element shape (5,)", r"Reshape the data"),
    ("generator-feature-shape", lambda c: _fit(c, _batches(c.x[:, :5], c.y)), ValueError, "`data` x",
     "per-element shape (5,)", r"Reshape the data"),
    ("pydataset-feature-shape", lambda c: _fit(c, _PyBatches(c.x[:, :5], c.y)), ValueError, "`data` x",
     "per-element shape (5,)", r"Reshape the data"),
    ("generator-not-tuples", lambda c: _fit(c, (row for row in c.x)), ValueError, "`data`", "a generator",
     r"Yield tuples of NumPy arrays"),
    ("pydataset-endless", lambda c: _fit(c, _PyBatches(c.x, c.y, endless=True)), ValueError, "`data`",
     "num_batches=None, steps_per_epoch=None", r"Pass steps_per_epoch=<steps>"),
    ("generator-warmup-epochs", lambda c: _fit(c, _batches(c.x, c.y), trainer=Trainer(warmup_epochs=1, verbose=0)),
     ValueError, "`warmup_epochs`", "unknown size", r"Pass warmup_steps, or steps_per_epoch"),
    ("dataset-with-y", lambda c: c_fit_keras(c, _ds(c.x).batch(8), c.y), ValueError, "`y`", "ndarray",
     r"drop y="),
    ("generator-class-weight", lambda c: _fit(c, _batches(c.x, c.y), class_weight={0: 2.0}), ValueError,
     "`class_weight`", "{0: 2.0}", r"Put the weights in the batches it yields"),
    # fit's Keras arguments
    ("validation-split-one", lambda c: _fit(c, validation_split=1.0), ValueError, "`validation_split`",
     "validation_split=1.0", r"Pass a fraction"),
    ("validation-split-negative", lambda c: _fit(c, validation_split=-0.1), ValueError, "`validation_split`",
     "validation_split=-0.1", r"Pass a fraction"),
    ("validation-split-string", lambda c: _fit(c, validation_split="0.2"), TypeError, "`validation_split`",
     "'0.2'", r"Pass a fraction"),
    ("validation-split-dataset", lambda c: _fit(c, _ds(c.x, c.y).batch(8), validation_split=0.2), ValueError,
     "`validation_split`", "batched dataset", r"Pass validation_data= instead"),
    ("class-weight-list", lambda c: _fit(c, class_weight=[1.0, 2.0]), TypeError, "`class_weight`", "[1.0, 2.0]",
     r"class_weight=\{0: 1.0, 1: 5.0\}"),
    ("class-weight-string-keys", lambda c: _fit(c, class_weight={"cat": 2.0}), TypeError, "`class_weight`",
     "'cat'", r"classes left out weigh 1.0"),
    ("class-and-sample-weight", lambda c: _fit(c, (c.x, c.y, c.w), class_weight={0: 2.0}), ValueError,
     "`class_weight` and `sample_weight`", "{0: 2.0}", r"Multiply the class weights into sample_weight"),
    ("validation-freq-zero", lambda c: _fit(c, validation_data=(c.x, c.y), validation_freq=0), ValueError,
     "`validation_freq`", "validation_freq=0", r"Pass e.g. validation_freq=1"),
    ("callback-keras-backup-and-restore-on-workers", _keras_backup_on_two_workers, ValueError, "`callbacks[0]`",
     "keras.callbacks.BackupAndRestore", r"from trainer.callbacks import BackupAndRestore"),
    ("too-few-arrays", lambda c: _fit(c, ([c.x[:, :4]], c.y)), ValueError, "`data` x", "1 arrays",
     r"Pass one array per input", named_inputs_model),
    ("fit-batch-size-string", lambda c: c_fit_keras(c, c.x, c.y, batch_size="64"), TypeError, "`batch_size`",
     "'64'", r"Pass the global batch size"),
    ("dataset-empty", lambda c: _fit(c, _ds(c.x, c.y).take(0)), ValueError, "`data`", "cardinality 0",
     r"Pass a dataset with examples"),
    ("dataset-unknown-rank",
     lambda c: _fit(c, _ds(c.x, c.y).map(lambda x, y: (tf.numpy_function(lambda a: a, [x], tf.float32), y))),
     ValueError, "`data`", "x of unknown rank", r"tf.ensure_shape\(x, "),
    ("validation-unknown-rank",
     lambda c: _fit(c, validation_data=_ds(c.x, c.y).map(lambda x, y: (x, tf.numpy_function(lambda a: a, [y],
                                                                                          tf.int64)))),
     ValueError, "`validation_data`", "y of unknown rank", r"Set the shape in the map"),
    ("dataset-sample-weight-shape", lambda c: _fit(c, _ds(c.x, c.y, np.ones((203, 4, 2), np.float32))),
     ValueError, "`data`'s sample_weight", "shape (4, 2) per element", r"Weight the examples"),
    ("dataset-feature-shape", lambda c: _fit(c, _ds(c.x[:, :5], c.y)), ValueError, "`data` x", "per-element shape (5,)",
     r"Reshape the data"),
    # the model
    ("uncompiled", lambda c: _fit(c), ValueError, "`model`", "uncompiled Sequential", r"Call model.compile",
     uncompiled_model),
    ("no-loss", lambda c: _fit(c), ValueError, "`model`", "compiled with loss=None",
     r"Call model.compile\(optimizer=..., loss=...\)", lossless_model),
    ("uncompiled-builder", lambda c: _fit(c), ValueError, "`model()`", "uncompiled Sequential",
     r"Call model.compile", lambda: uncompiled_model),
    ("train-on-batch-scalar", _train_on_batch_of_a_scalar, ValueError, "`x`", "shapes [()]",
     r"Pass arrays or tensors with one row per example"),
    ("not-a-model", lambda c: Trainer(strategy="default", verbose=0).fit(3, (c.x, c.y)), TypeError, "`model`",
     "model of type int", r"a zero-argument function returning one"),
    # a strategy's scope
    ("strategy-inside-another-scope", _inside_another_scope, ValueError, "`strategy`", "strategy='one_device'",
     r"Call the trainer after the `with strategy.scope\(\):` block"),
    # evaluate and predict
    ("evaluate-feature-shape", lambda c: Trainer(strategy="default").evaluate(c.model, (c.x[:, 1:], c.y)),
     ValueError, "`data` x", "(203, 7)", r"Reshape the data"),
    ("evaluate-labels", lambda c: Trainer(strategy="default").evaluate(c.model, (c.x, c.y + 7)), ValueError,
     "`data` y", "max=9", r"Use labels 0..2"),
    ("evaluate-infinite", lambda c: Trainer(strategy="default").evaluate(c.model, _ds(c.x, c.y).repeat()),
     ValueError, "`data`", "steps=None", r"Pass steps=<steps>"),
    ("predict-feature-shape", lambda c: Trainer(strategy="default").predict(c.model, c.x[:, :3]), ValueError,
     "`x`", "(203, 3)", r"Reshape the data"),
    ("predict-missing-key", lambda c: Trainer(strategy="default").predict(c.model, {"a": c.x[:, :4], "z": c.x[:, 4:]}),
     ValueError, "`x`", "missing: ['b']", r"rename the keys", named_inputs_model),
    ("predict-infinite", lambda c: Trainer(strategy="default").predict(c.model, _ds(c.x).repeat()), ValueError,
     "`x`", "cardinality INFINITE", r"x.take\("),
    # callbacks: checked when created
    ("checkpoint-under-a-file", lambda c: ModelCheckpoint(c.a_file / "ckpt"), ValueError, "`directory`",
     "a_file/ckpt'", r"Pass a path whose parents are directories"),
    ("checkpoint-read-only", lambda c: ModelCheckpoint(c.read_only() / "ckpt"), ValueError, "`directory`",
     "/ckpt'", r"Pass a writable location"),
    ("checkpoint-is-a-file", lambda c: ModelCheckpoint(c.a_file), ValueError, "`directory`", "a_file'",
     r"Pass a directory that is not taken"),
    ("checkpoint-mode", lambda c: ModelCheckpoint(c.tmp / "ckpt", mode="best"), ValueError, "`mode`",
     "mode='best'", r"Pass 'min' for losses"),
    ("checkpoint-keep", lambda c: ModelCheckpoint(c.tmp / "ckpt", keep=0), ValueError, "`keep`", "keep=0",
     r"Pass how many checkpoints to keep"),
    ("checkpoint-monitor", lambda c: ModelCheckpoint(c.tmp / "ckpt", monitor=0.5), TypeError, "`monitor`",
     "monitor=0.5", r"Pass e.g. monitor='val_loss'"),
    ("backup-save-freq", lambda c: BackupAndRestore(c.tmp / "b", save_freq=0), ValueError, "`save_freq`",
     "save_freq=0", r"Pass save_freq='epoch'"),
    ("backup-under-a-file", lambda c: BackupAndRestore(c.a_file / "backup"), ValueError, "`backup_dir`",
     "a_file/backup'", r"Pass a path whose parents are directories"),
    ("backup-read-only", lambda c: BackupAndRestore(c.read_only() / "backup"), ValueError, "`backup_dir`",
     "/backup'", r"Pass a writable location"),
    ("backup-dir-type", lambda c: BackupAndRestore(42), TypeError, "`backup_dir`", "backup_dir=42",
     r"Pass e.g. backup_dir="),
    ("csv-is-a-directory", lambda c: CSVLogger(c.tmp), ValueError, "`path`", "which is a directory",
     r"Pass a file path that is not taken"),
    ("csv-under-a-file", lambda c: CSVLogger(c.a_file / "log.csv"), ValueError, "`path`", "a_file/log.csv'",
     r"Pass a path whose parents are directories"),
    ("json-read-only", lambda c: JSONLogger(c.read_only() / "log.jsonl"), ValueError, "`path`", "/log.jsonl'",
     r"Pass a writable location"),
    ("json-empty-path", lambda c: JSONLogger(""), ValueError, "`path`", "path=''", r"Pass e.g. path="),
    ("tensorboard-update-freq", lambda c: TensorBoard(c.tmp / "tb", update_freq=0), ValueError, "`update_freq`",
     "update_freq=0", r"Pass update_freq='epoch'"),
    ("tensorboard-is-a-file", lambda c: TensorBoard(c.a_file), ValueError, "`log_dir`", "which is a file",
     r"Pass a directory that is not taken"),
    ("plot-under-a-file", lambda c: PlotHistory(c.a_file / "c.png"), ValueError, "`path`", "a_file/c.png'",
     r"Pass a path whose parents are directories"),
    ("progress-mode", lambda c: ProgressBar(mode="fancy"), ValueError, "`mode`", "mode='fancy'", r"Pass 'auto'"),
    ("progress-file", lambda c: ProgressBar(file=3), TypeError, "`file`", "file=3", r"Pass e.g. file=sys.stderr"),
    # trainer-launch
    ("launch-workers-0", _cli(launch.main, "--workers", "0", "{file}"), CLI, "--workers", "--workers '0'",
     r"Pass e.g. --workers 2"),
    ("launch-workers-word", _cli(launch.main, "--workers", "two", "{file}"), CLI, "--workers", "--workers 'two'",
     r"Pass e.g. --workers 2"),
    ("launch-ps-negative", _cli(launch.main, "--ps", "-1", "{file}"), CLI, "--ps", "--ps '-1'", r"Pass e.g. --ps 2"),
    ("launch-no-script", _cli(launch.main, "--workers", "2"), CLI, "script", "no script argument",
     r"trainer-launch --workers 2 train.py"),
    ("launch-script-missing", _cli(launch.main, "{tmp}/nope.py"), CLI, "script", "nope.py' (no such file",
     r"Check the path"),
    ("launch-script-is-a-directory", _cli(launch.main, "{tmp}"), CLI, "script", "(a directory", r"Check the path"),
    ("launch-nodes-without-secret", lambda c: (c.monkeypatch.delenv("TRAINER_RDZV_SECRET", raising=False),
                                               _cli(launch.main, "--nnodes", "2", "--master-addr", "h", "{file}")(c)),
     CLI, "TRAINER_RDZV_SECRET", "no TRAINER_RDZV_SECRET in the environment", r"export TRAINER_RDZV_SECRET="),
    ("launch-nnodes-min-above-max", _cli(launch.main, "--nnodes", "3:2", "--master-addr", "h", "{file}"), CLI,
     "--nnodes", "--nnodes '3:2'", r"Pass e.g. --nnodes 2, or --nnodes 1:2"),
    ("launch-restarts-negative", _cli(launch.main, "--max-restarts", "-1", "{file}"), CLI, "--max-restarts",
     "--max-restarts '-1'", r"Pass e.g. --max-restarts 2"),
    ("launch-elastic-without-restarts", _cli(launch.main, "--nnodes", "1:2", "--master-addr", "h", "{file}"), CLI,
     "--max-restarts", "--max-restarts 0", r"Pass e.g. --max-restarts 3, or --nnodes N"),
    ("launch-secret-file-missing", _cli(launch.main, "--nnodes", "2", "--master-addr", "h", "--rdzv-secret-file",
                                        "{tmp}/nope", "{file}"),
     CLI, "--rdzv-secret-file", "nope' (No such file", r"pass --rdzv-secret-file FILE"),
    # the example's flags
    ("example-epochs-0", _cli(fashion_mnist.parse_args, "--epochs", "0"), CLI, "--epochs", "--epochs 0",
     r"Pass e.g. --epochs 2"),
    ("example-batch-negative", _cli(fashion_mnist.parse_args, "--batch", "-1"), CLI, "--batch", "--batch -1",
     r"Pass e.g. --batch 2"),
    ("example-steps-0", _cli(fashion_mnist.parse_args, "--steps", "0"), CLI, "--steps", "--steps 0",
     r"Pass e.g. --steps 2"),
    ("example-lr-negative", _cli(fashion_mnist.parse_args, "--lr", "-0.1"), CLI, "--lr", "--lr -0.1",
     r"Pass e.g. --lr 0.001"),
    ("example-data-dir-missing", _cli(fashion_mnist.parse_args, "--data-dir", "{tmp}/nowhere"), CLI, "--data-dir",
     "nowhere'", r"Check the path, or pass --synthetic N"),
    ("example-strategy-typo", _cli(fashion_mnist.parse_args, "--strategy", "mirorred"), CLI, "--strategy",
     "--strategy 'mirorred'", r"Did you mean --strategy mirrored\?"),
    ("example-out-under-a-file", _cli(fashion_mnist.parse_args, "--out", "{file}/run"), CLI, "--out",
     "a_file/run'", r"Pass a path whose parents are directories"),
]


# The same call through Keras: model.fit, evaluate or predict on one device, on the row's model and data.
# Where the trainer batches a dataset of examples itself, Keras gets it batched (Keras's default batch, 32).


class RunsForever(Exception):
    """Raised by `Forever` once a pass has read far more batches than the data could end in."""


class Forever(keras.callbacks.Callback):
    """Stops a Keras call whose pass never ends (an endless dataset with no step count)."""

    def __init__(self, limit=100):
        super().__init__()
        self.limit, self.seen = limit, 0

    def _count(self, *args, **kwargs):
        self.seen += 1
        if self.seen > self.limit:
            raise RunsForever()

    on_train_batch_end = on_test_batch_end = on_predict_batch_end = _count

    def on_epoch_end(self, epoch, logs=None):
        self.seen = 0


def _k(c):
    """The row's model for the Keras side (a builder is called, as fit would call it)."""
    return c.model if isinstance(c.model, keras.Model) else c.model()


def _kfit(*args, **kwargs):
    return lambda c: _k(c).fit(*(a(c) if callable(a) else a for a in args), verbose=0, **kwargs)


def _kcall(method, x, *rest, **kwargs):
    return lambda c: getattr(_k(c), method)(x(c), *(r(c) for r in rest), verbose=0, **kwargs)


X, Y, W = (lambda c: c.x), (lambda c: c.y), (lambda c: c.w)
KERAS_SIDE = {
    "epochs-float": _kfit(X, Y, epochs=2.5),
    "train-on-batch-scalar": lambda c: _k(c).train_on_batch(np.float32(1.0), c.y[:1]),
    "callback-not-a-callback": _kfit(X, Y, callbacks=[keras.callbacks.History(), object()]),
    "evaluate-callback-not-a-callback": _kcall("evaluate", X, Y, callbacks=["log"]),
    "feature-shape": _kfit(lambda c: c.x[:, :5], Y),
    "feature-shape-builder": _kfit(lambda c: c.x[:, :5], Y),
    "string-features": _kfit(lambda c: c.x.astype(str), Y),
    "object-array": _kfit(lambda c: np.array([np.ones(8)] * 3 + [np.ones(7)], dtype=object), lambda c: c.y[:4]),
    "ragged-list": _kfit(lambda c: [[1.0] * 8, [1.0] * 7], lambda c: c.y[:2]),
    "labels-too-large": _kfit(X, lambda c: c.y + 1),
    "labels-negative": _kfit(X, lambda c: c.y - 1),
    "string-labels": _kfit(X, lambda c: c.y.astype(str)),
    "missing-dict-key": _kfit(lambda c: {"a": c.x[:, :4], "c": c.x[:, 4:]}, Y),
    "sequential-dict-other-key": _kfit(lambda c: {"other": c.x}, Y),
    "dict-key-among-the-inputs": _kfit(lambda c: {"a": c.x[:, :4], "aa": c.x[:, 4:], "b": c.x[:, 4:]}, Y),
    "lengths-differ": _kfit(X, lambda c: c.y[:-1]),
    "sample-weight-length": _kfit(X, Y, lambda c: c.w[:10]),
    "sample-weight-rank-3": _kfit(X, Y, lambda c: np.ones((203, 4, 2), np.float32)),
    "sample-weight-dict": _kfit(X, Y, lambda c: {"out": c.w}),
    "empty-arrays": _kfit(lambda c: c.x[:0], lambda c: c.y[:0]),
    "features-only-for-a-compiled-loss": _kfit(X),
    "features-only-dataset-for-a-compiled-loss": _kfit(
        lambda c: tf.data.Dataset.from_tensor_slices({"image": c.x, "label": c.y}).batch(32)),
    "class-weight-without-targets": _kfit(X, None, class_weight={0: 2.0}),
    "not-data": _kfit(3),
    "scalar-arrays": _kfit(lambda c: np.float32(1.0), lambda c: np.int64(0)),
    "callbacks-a-string": _kfit(X, Y, callbacks="log"),
    "stateful-batch-mismatch": _kfit(lambda c: _sequences(c)[:200], lambda c: c.y[:200], batch_size=16),
    "stateful-partial-batch": _kfit(lambda c: _sequences(c)[:201], lambda c: c.y[:201], batch_size=8),
    "validation-split-empty-side": _kfit(X, Y, validation_split=0.999),
    "class-weight-multi-output": _kfit(X, lambda c: (c.y, c.y), class_weight={0: 2.0}),
    "fit-override-batch-by-batch": _kfit(X, Y),
    "validation-shape": _kfit(X, Y, validation_data=None) if False else (
        lambda c: _k(c).fit(c.x, c.y, validation_data=(c.x[:, :4], c.y), verbose=0)),
    "validation-structure-dict": lambda c: _k(c).fit(c.x, c.y, validation_data=({"a": c.x}, c.y), verbose=0),
    "dataset-one-component": _kfit(lambda c: _ds(c.x).batch(32)),
    "dataset-four-components": _kfit(lambda c: _ds(c.x, c.y, c.w, c.w).batch(32)),
    "dataset-infinite": lambda c: _k(c).fit(_ds(c.x, c.y).batch(32).repeat(), verbose=0, callbacks=[Forever()]),
    "validation-infinite": lambda c: _k(c).fit(c.x, c.y, validation_data=_ds(c.x, c.y).batch(32).repeat(),
                                               verbose=0, callbacks=[Forever()]),
    "batched-feature-shape": _kfit(lambda c: _ds(c.x[:, :5], c.y).batch(8, drop_remainder=True)),
    "generator-feature-shape": _kfit(lambda c: _batches(c.x[:, :5], c.y)),
    "pydataset-feature-shape": _kfit(lambda c: _PyBatches(c.x[:, :5], c.y)),
    "generator-not-tuples": _kfit(lambda c: (row for row in c.x)),
    "pydataset-endless": lambda c: _k(c).fit(_PyBatches(c.x, c.y, endless=True), verbose=0, callbacks=[Forever()]),
    "dataset-with-y": _kfit(lambda c: _ds(c.x).batch(8), Y),
    "generator-class-weight": _kfit(lambda c: _batches(c.x, c.y), class_weight={0: 2.0}),
    "validation-split-one": _kfit(X, Y, validation_split=1.0),
    "validation-split-negative": _kfit(X, Y, validation_split=-0.1),
    "validation-split-string": _kfit(X, Y, validation_split="0.2"),
    "validation-split-dataset": _kfit(lambda c: _ds(c.x, c.y).batch(8), validation_split=0.2),
    "class-weight-list": _kfit(X, Y, class_weight=[1.0, 2.0]),
    "class-weight-string-keys": _kfit(X, Y, class_weight={"cat": 2.0}),
    "class-and-sample-weight": _kfit(X, Y, W, class_weight={0: 2.0}),
    "validation-freq-zero": lambda c: _k(c).fit(c.x, c.y, validation_data=(c.x, c.y), validation_freq=0, verbose=0),
    "too-few-arrays": _kfit(lambda c: [c.x[:, :4]], Y),
    "fit-batch-size-string": _kfit(X, Y, batch_size="64"),
    "dataset-empty": _kfit(lambda c: _ds(c.x, c.y).take(0).batch(32)),
    "dataset-unknown-rank": _kfit(lambda c: _ds(c.x, c.y).map(
        lambda x, y: (tf.numpy_function(lambda a: a, [x], tf.float32), y)).batch(32)),
    "validation-unknown-rank": lambda c: _k(c).fit(c.x, c.y, verbose=0, validation_data=_ds(c.x, c.y).map(
        lambda x, y: (x, tf.numpy_function(lambda a: a, [y], tf.int64))).batch(32)),
    "dataset-sample-weight-shape": _kfit(lambda c: _ds(c.x, c.y, np.ones((203, 4, 2), np.float32)).batch(32)),
    "dataset-feature-shape": _kfit(lambda c: _ds(c.x[:, :5], c.y).batch(32)),
    "uncompiled": _kfit(X, Y),
    "no-loss": _kfit(X, Y),
    "uncompiled-builder": _kfit(X, Y),
    "evaluate-feature-shape": _kcall("evaluate", lambda c: c.x[:, 1:], Y),
    "evaluate-labels": _kcall("evaluate", X, lambda c: c.y + 7),
    "evaluate-infinite": _kcall("evaluate", lambda c: _ds(c.x, c.y).batch(32).repeat(), callbacks=[Forever()]),
    "predict-feature-shape": _kcall("predict", lambda c: c.x[:, :3]),
    "predict-missing-key": _kcall("predict", lambda c: {"a": c.x[:, :4], "z": c.x[:, 4:]}),
    "predict-infinite": _kcall("predict", lambda c: _ds(c.x).batch(32).repeat(), callbacks=[Forever()]),
}


def keras_outcome(row, tmp_path, monkeypatch) -> str:
    """What Keras did with the row's call: "fails", "trains" (it completed) or "never ends"."""
    name, _, _, _, _, _, *make_model = row
    x, y, w = tiny_data()
    make = make_model[0] if make_model else tiny_model
    c = Context(x=x, y=y, w=w, tmp=tmp_path, monkeypatch=monkeypatch, restore=[], model=make())
    try:
        KERAS_SIDE[name](c)
    except RunsForever:
        return "never ends"
    except Exception:  # noqa: BLE001 (any error: Keras refused or crashed)
        return "fails"
    return "trains"


class Context(types.SimpleNamespace):
    def read_only(self):
        """A directory where no file can be created (chmod 555, or for root a read-only file system)."""
        directory = self.tmp / "read_only"
        directory.mkdir()
        directory.chmod(0o555)
        self.restore.append(lambda: directory.chmod(0o755))
        for candidate in (directory, "/sys", "/proc/self"):  # root ignores 555; sysfs refuses even root
            try:
                open(os.path.join(candidate, ".probe"), "w").close()
                os.remove(os.path.join(candidate, ".probe"))
            except OSError:
                return type(self.tmp)(candidate)
        pytest.skip("no directory here refuses writes (running as root on writable file systems only)")


def _files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, names in os.walk(root) for f in names)


def _weights(model):
    return [w.copy() for w in model.get_weights()] if model.built else []


@pytest.mark.slow
@pytest.mark.parametrize("row", [pytest.param(r, id=r[0]) for r in ROWS])
def test_bad_input_is_refused_clearly_before_anything_changes(row, tmp_path, monkeypatch, capsys):
    name, call, error, arg, value, fix, *make_model = row
    monkeypatch.delenv("TF_CONFIG", raising=False)
    make = make_model[0] if make_model else tiny_model
    x, y, w = tiny_data()
    c = Context(x=x, y=y, w=w, tmp=tmp_path, monkeypatch=monkeypatch, restore=[], model=make())
    c.a_file = tmp_path / "a_file"
    c.a_file.write_text("not a directory")
    model = c.model if isinstance(c.model, keras.Model) else None  # a builder's model is built in the call
    weights, optimizer = _weights(model) if model else [], getattr(model, "optimizer", None)
    files = _files(tmp_path)
    try:
        with pytest.raises(error) as caught:
            call(c)
    finally:
        for undo in c.restore:
            undo()
    if error is CLI:
        assert caught.value.code == 2
        message = capsys.readouterr().err
    else:
        message = str(caught.value)
        frame = str(caught.traceback[-1].path)  # raised by our code, not deep inside TensorFlow or Keras
        assert frame.startswith(REPO) and "site-packages" not in frame, frame
        assert not isinstance(caught.value, tf.errors.OpError)
    assert arg in message, message
    assert value in message, message
    assert re.search(fix, message), message
    assert _files(tmp_path) == files  # nothing written
    if model is not None:
        assert getattr(model, "optimizer", None) is optimizer
        if optimizer is not None:
            assert int(optimizer.iterations.numpy()) == 0 and not optimizer.built
        for before, after in zip(weights, _weights(model)):
            np.testing.assert_array_equal(before, after)


# Rows with no model.fit counterpart: the Trainer's own settings, strategies and clusters, its callbacks and
# command lines, which model.fit has not, and several workers, where model.fit does not run.
TRAINER_ONLY = ("per-replica-", "batch-negative", "batch-float", "batch-string", "both-batch-", "lr-scaling",
                "data-sharding-", "file-shards-",
                "warmup-", "steps-per-execution", "jit-compile", "seed-", "strategy-", "tpu-", "tf-config-",
                "generator-warmup-", "not-a-model", "checkpoint-", "backup-", "csv-", "json-",
                "tensorboard-", "plot-", "progress-", "launch-", "example-", "nan-guard-", "mixed-precision-",
                "batch-norm-", "callback-keras-backup-and-restore-on-workers", "stateful-on-replicas",
                "generator-on-workers", "shuffled-pydataset-on-workers", "pydataset-under-parameter-server")

# Refusals of calls that model.fit runs: deliberate limits. Each message gives the reason (it names
# model.fit), and the README's Limits names each with the words here.
# Which calls model.fit runs moved in Keras 3.16: it refuses empty data and class_weight keys that are not class
# indices, takes a dict by key, and takes elements of unknown rank.
if _compat.KERAS_VERSION < (3, 16):
    DELIBERATE = {"empty-arrays": "empty data", "dataset-empty": "empty data",
                  "class-weight-string-keys": "`class_weight` keys",
                  "dict-key-among-the-inputs": "sort among the inputs' keys"}
else:
    DELIBERATE = {"dataset-unknown-rank": "elements of unknown rank",
                  "validation-unknown-rank": "elements of unknown rank"}
DELIBERATE.update({
    "dataset-infinite": "endless data", "validation-infinite": "endless data", "pydataset-endless": "endless data",
    "evaluate-infinite": "endless data", "predict-infinite": "endless data",
    "validation-split-negative": "a negative `validation_split`",
})


def test_every_row_is_held_against_model_fit_or_is_the_trainers_own():
    for name in (r[0] for r in ROWS):
        assert (name in KERAS_SIDE) != name.startswith(TRAINER_ONLY), name
    assert set(DELIBERATE) <= set(KERAS_SIDE)


@pytest.mark.slow
@pytest.mark.parametrize("row", [pytest.param(r, id=r[0]) for r in ROWS if r[0] in KERAS_SIDE])
def test_each_refusal_stands_where_model_fit_fails_too(row, tmp_path, monkeypatch):
    """model.fit (or evaluate, predict) runs the row's call first, on one device; what it did decides:
    where it fails too, the trainer's refusal stands (the table's first test checks its message); where it
    runs, the refusal must be a deliberate limit, whose message says why and which the README names."""
    name = row[0]
    outcome = keras_outcome(row, tmp_path / "keras", monkeypatch)
    if name not in DELIBERATE:
        assert outcome == "fails", f"model.fit {outcome} on {name}'s call: the trainer's refusal is a false one"
        return
    assert outcome in ("trains", "never ends"), f"model.fit fails on {name}'s call too: not a deliberate limit"
    x, y, w = tiny_data()
    make = row[6] if len(row) > 6 else tiny_model
    c = Context(x=x, y=y, w=w, tmp=tmp_path, monkeypatch=monkeypatch, restore=[], model=make())
    with pytest.raises(row[2], match="model.fit"):
        row[1](c)
    limits = README[README.index("## Limits"):README.index("## Documentation")]
    assert DELIBERATE[name] in limits, DELIBERATE[name]


README = (TESTS.parent / "README.md").read_text()
CHECKS = ("trainer/checks.py", "trainer/model/checks.py", "trainer/data/boundary.py", "trainer/data/user_arrays.py",
          "trainer/data/keras_forms.py", "trainer/data/class_weights.py", "trainer/data/checks.py",
          "trainer/options.py")


def _raised_where(row, tmp_path, monkeypatch) -> tuple[str, int] | None:
    """(file, line) in the checks where the row's refusal was raised."""
    x, y, w = tiny_data()
    make = row[6] if len(row) > 6 else tiny_model
    tmp_path.mkdir()
    c = Context(x=x, y=y, w=w, tmp=tmp_path, monkeypatch=monkeypatch, restore=[], model=make())
    c.a_file = tmp_path / "a_file"
    c.a_file.write_text("not a directory")
    try:
        row[1](c)
    except (ValueError, TypeError) as err:
        for frame in reversed(traceback.extract_tb(err.__traceback__)):
            path = os.path.relpath(frame.filename, REPO)
            if path in CHECKS:
                return path, frame.lineno
    except SystemExit:
        pass
    finally:
        for undo in c.restore:
            undo()
    return None


@pytest.mark.slow
def test_every_refusal_in_the_checks_has_a_row(tmp_path, monkeypatch, capsys):
    """Each `raise ValueError/TypeError` of the modules that check a call (CHECKS) is reached by a
    row, so each is held against model.fit (or is the trainer's own)."""
    monkeypatch.delenv("TF_CONFIG", raising=False)
    sites = [(path, number) for path in CHECKS
             for number, line in enumerate((TESTS.parent / path).read_text().splitlines(), 1)
             if re.search(r"raise (ValueError|TypeError)\(", line)
             and not ("# Keras 3.8-3.15 only" in line and _compat.KERAS_VERSION >= (3, 16))]
    reached = set()
    for i, row in enumerate(ROWS):
        where = _raised_where(row, tmp_path / str(i), monkeypatch)
        monkeypatch.delenv("TF_CONFIG", raising=False)
        if where is not None:  # the raise statement at or before the line the traceback names
            reached.add(max((site for site in sites if site[0] == where[0] and site[1] <= where[1]),
                            key=lambda site: site[1]))
    capsys.readouterr()
    assert sorted(set(sites) - reached) == []


def _fit_both(kwargs, x_of=lambda x: x, trainer_kwargs=None):
    """model.fit and Trainer.fit on the same data and seed: (history, weights, warnings) of each."""
    x, y, w = tiny_data()
    runs = []
    for side in ("keras", "trainer"):
        model = tiny_model()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call = {key: value() if callable(value) else value for key, value in kwargs.items()}
            if side == "keras":
                history = model.fit(x_of(x), y, batch_size=32, shuffle=False, verbose=0, **call)
            else:
                trainer = Trainer(strategy="default", batch_size=32, verbose=0)
                history = trainer.fit(model, x_of(x), y, shuffle=False, **call, **(trainer_kwargs or {}))
        kinds = {str(m.message).splitlines()[0] for m in caught if "ran out of data" in str(m.message)}
        runs.append((history, model.get_weights(), kinds))
    return runs


# Calls the trainer refused before it was held against model.fit, which model.fit runs: now they train, with
# model.fit's numbers and its warnings.
FORMER_REFUSALS = {
    "epochs-negative": dict(epochs=-1),
    "epochs-bool": dict(epochs=True),
    "initial-epoch-after-epochs": dict(epochs=2, initial_epoch=3),
    "callbacks-not-a-list": dict(callbacks=keras.callbacks.History, epochs=2),
    "steps-per-epoch-0": dict(steps_per_epoch=0, epochs=2),
    "steps-per-epoch-beyond-arrays": dict(steps_per_epoch=10, epochs=2),
    "validation-freq-zero-without-validation": dict(validation_freq=0, epochs=2),
    "validation-freq-list": dict(validation_data=lambda: tiny_data(40, seed=1)[:2], validation_freq=[1, 3],
                                 epochs=3),
    "validation-steps-0": dict(validation_data=lambda: tiny_data(40, seed=1)[:2], validation_steps=0, epochs=2),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FORMER_REFUSALS) + ["too-many-arrays"])
def test_calls_model_fit_runs_train_with_its_numbers(name):
    if name == "too-many-arrays":  # Keras feeds the first array to the one input, and warns
        (reference, ref_weights, ref_warnings), (history, weights, seen) = _fit_both(
            dict(epochs=2), x_of=lambda x: [x, x * 2])
    else:
        (reference, ref_weights, ref_warnings), (history, weights, seen) = _fit_both(FORMER_REFUSALS[name])
    assert history.epoch == reference.epoch
    assert sorted(history.history) == sorted(reference.history)
    for key, values in reference.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)
    for a, b in zip(weights, ref_weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert seen == ref_warnings


def _warnings_of(call) -> set[str]:
    """The first lines of the warnings a call gives, with every filter set to always."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return {str(w.message).splitlines()[0] for w in caught if issubclass(w.category, UserWarning)}


@pytest.mark.slow
@pytest.mark.parametrize("case", ["dataset", "steps-beyond-arrays", "more-arrays-than-inputs",
                                  "dataset-of-unknown-length", "steps-beyond-a-dataset", "grain-dataset"])
def test_fit_warns_as_model_fit_warns(case):
    x, y, w = tiny_data()
    if case == "grain-dataset":
        grain = pytest.importorskip("grain")  # the 'ecosystem' extra; model.fit takes grain from Keras 3.10
        if not _compat.is_grain_dataset(grain.MapDataset.range(1)):
            pytest.skip("this Keras's model.fit takes no grain dataset")
    data = {"grain-dataset": (lambda: grain.MapDataset.source(list(zip(x, y))).batch(32), None, {}),
            "dataset": (lambda: _ds(x, y).batch(32), None, {}),
            "dataset-of-unknown-length": (lambda: _ds(x, y).batch(32).filter(lambda *_: True), None, {}),
            "steps-beyond-a-dataset": (lambda: _ds(x, y).batch(32), None, {"steps_per_epoch": 10}),
            "steps-beyond-arrays": (lambda: x, y, {"steps_per_epoch": 10}),
            "more-arrays-than-inputs": (lambda: [x, x], y, {})}[case]
    features, targets, kwargs = data
    model = tiny_model()
    expected = _warnings_of(lambda: model.fit(features(), targets, batch_size=32, epochs=2, verbose=0, **kwargs))
    trainer = Trainer(strategy="default", batch_size=32, verbose=0)
    seen = _warnings_of(lambda: trainer.fit(tiny_model(), features(), targets, epochs=2, **kwargs))
    assert seen == expected
    assert expected or case == "dataset"  # Keras 3.8 gives no warning for a dataset with shuffle=True


@pytest.mark.slow
def test_evaluate_with_steps_0_evaluates_everything_as_keras_does():
    x, y, w = tiny_data()
    model = tiny_model()
    reference = model.evaluate(x, y, batch_size=32, steps=0, verbose=0)
    np.testing.assert_allclose(Trainer(strategy="default", batch_size=32).evaluate(model, x, y, steps=0), reference,
                               rtol=1e-6)


def test_the_table_covers_every_entry_point():
    assert len(ROWS) >= 30
    ids = [r[0] for r in ROWS]
    assert len(set(ids)) == len(ids)
    for prefix in ("launch-", "example-", "evaluate-", "predict-", "checkpoint-", "backup-", "csv-", "json-",
                   "tensorboard-", "progress-", "tf-config-", "dataset-"):
        assert any(i.startswith(prefix) for i in ids), prefix


@pytest.mark.slow
@pytest.mark.parametrize("where", ["x", "y", "sample_weight", "validation_data"])
def test_non_finite_arrays_warn_with_the_count_and_the_array(where):
    x, y, w = tiny_data()
    y = y.astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    arrays = {"x": x.copy(), "y": y.copy(), "sample_weight": w.copy()}
    target = arrays["x" if where == "validation_data" else where]
    target[5] = np.nan
    target[17:20] = np.inf
    expected = int(np.count_nonzero(~np.isfinite(target)))
    rows = int(np.count_nonzero((~np.isfinite(target.reshape(len(target), -1))).any(axis=1)))
    trainer = Trainer(strategy="default", verbose=0, nan_guard=False)
    if where == "validation_data":
        call = lambda: trainer.fit(model, (x, y), validation_data=(arrays["x"], y))  # noqa: E731
        arg = "`validation_data` x"
    else:
        call = lambda: trainer.fit(model, (arrays["x"], arrays["y"], arrays["sample_weight"]))  # noqa: E731
        arg = f"`data` {where}"
    with pytest.warns(UserWarning) as record:
        call()
    messages = [str(r.message) for r in record if "non-finite" in str(r.message)]
    assert len(messages) == 1, messages
    assert messages[0].startswith(f"{arg} holds {expected} non-finite values (NaN or Inf) in {rows} of 203 rows "
                                  "(the first in row 5)"), messages[0]
    assert "Drop or fix those rows (e.g. np.nan_to_num)." in messages[0]


def test_finite_arrays_do_not_warn():
    x, y, w = tiny_data()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        from trainer.data import boundary as data, checks as data_checks

        data_checks.check_data(data.as_input((x, y, w), arg="data"), "data", steps_arg=None, steps=None)


def test_zero_epochs_is_nothing_to_do_as_in_keras():
    model = tiny_model()
    before = [w.copy() for w in model.get_weights()]
    x, y, w = tiny_data()
    history = Trainer(strategy="default", verbose=0).fit(model, (x, y), epochs=0)
    assert history.epoch == [] and history.history == {}
    assert int(model.optimizer.iterations.numpy()) == 0
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(b, a)


def test_missing_output_directories_are_created(tmp_path):
    x, y, w = tiny_data(64)
    deep = tmp_path / "not" / "yet"
    Trainer(strategy="default", verbose=0).fit(tiny_model(), (x, y), epochs=1, callbacks=[
        ModelCheckpoint(deep / "ckpt"), CSVLogger(deep / "logs" / "log.csv"), JSONLogger(deep / "log.jsonl"),
        TensorBoard(deep / "tb"), BackupAndRestore(deep / "backup")])
    assert (deep / "ckpt" / "last.keras").exists() and (deep / "logs" / "log.csv").exists()
    assert (deep / "log.jsonl").exists() and any((deep / "tb" / "train").iterdir())
    assert (deep / "backup").is_dir()  # the backup itself is removed once training completes
