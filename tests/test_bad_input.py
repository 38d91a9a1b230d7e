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
import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from trainer.callbacks import (BackupAndRestore, CSVLogger, JSONLogger, ModelCheckpoint, PlotHistory, ProgressBar,
                               TensorBoard)
from conftest import TESTS, mirrored, tiny_data, tiny_model
from trainer import Trainer, launch

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
    ("epochs-negative", lambda c: _fit(c, epochs=-1), ValueError, "`epochs`", "epochs=-1", r"Pass the epoch"),
    ("epochs-float", lambda c: _fit(c, epochs=2.5), TypeError, "`epochs`", "epochs=2.5", r"Pass the epoch"),
    ("epochs-bool", lambda c: _fit(c, epochs=True), TypeError, "`epochs`", "epochs=True", r"Pass the epoch"),
    ("initial-epoch-after-epochs", lambda c: _fit(c, epochs=2, initial_epoch=3), ValueError, "`initial_epoch`",
     "initial_epoch=3", r"pass epochs >= 3"),
    ("callback-not-a-callback", lambda c: _fit(c, callbacks=[keras.callbacks.History(), object()]), TypeError,
     "`callbacks[1]`", "<object object at", r"Subclass keras.callbacks.Callback"),
    ("callbacks-not-a-list", lambda c: _fit(c, callbacks=keras.callbacks.History()), TypeError, "`callbacks`",
     "callbacks=<keras.src.callbacks.history.History", r"Pass a list: callbacks=\[...\]"),
    ("callback-keras-backup-and-restore",
     lambda c: _fit(c, callbacks=[keras.callbacks.BackupAndRestore(str(c.tmp / "backup"))]), ValueError,
     "`callbacks[0]`", "keras.callbacks.BackupAndRestore", r"from trainer.callbacks import BackupAndRestore"),
    ("evaluate-callback-not-a-callback", lambda c: Trainer(strategy="default", verbose=0).evaluate(
        c.model, (c.x, c.y), callbacks=["log"]), TypeError, "`callbacks[0]`", "'log' of type str",
     r"Subclass keras.callbacks.Callback"),
    ("steps-per-epoch-0", lambda c: _fit(c, steps_per_epoch=0), ValueError, "`steps_per_epoch`",
     "steps_per_epoch=0", r"Pass a positive number of steps"),
    ("steps-per-epoch-beyond-arrays",
     lambda c: _fit(c, trainer=Trainer(strategy="default", batch_size=32, verbose=0), steps_per_epoch=10),
     ValueError, "`steps_per_epoch`", "steps_per_epoch=10", r"Pass steps_per_epoch<=7, or None for one pass"),
    ("warmup-steps-beyond-training",
     lambda c: _fit(c, trainer=Trainer(strategy="default", batch_size=32, warmup_steps=1000, verbose=0), epochs=2),
     ValueError, "`warmup_steps`", "warmup_steps=1000", r"Lower it to at most 14 steps, or train for more epochs"),
    ("warmup-epochs-beyond-training",
     lambda c: _fit(c, trainer=Trainer(strategy="default", batch_size=32, warmup_epochs=5, verbose=0), epochs=2),
     ValueError, "`warmup_epochs`", "warmup_epochs=5", r"Lower it to at most 14 steps"),
    ("batch-below-replicas", lambda c: _fit(c, trainer=Trainer(strategy=mirrored(4), batch_size=3, verbose=0)),
     ValueError, "`batch_size`", "batch_size=3", r"Pass batch_size>=4"),
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
    ("missing-dict-key", lambda c: _fit(c, ({"a": c.x[:, :4], "c": c.x[:, 4:]}, c.y)), ValueError, "`data` x",
     "missing: ['b']", r"The model's inputs are \['a', 'b'\]: rename the keys", named_inputs_model),
    ("too-many-arrays", lambda c: _fit(c, ([c.x, c.x], c.y)), ValueError, "`data` x", "2 arrays",
     r"Pass one array per input"),
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
    ("validation-freq-zero", lambda c: _fit(c, validation_freq=0), ValueError, "`validation_freq`",
     "validation_freq=0", r"Pass a positive number of epochs"),
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
    ("not-a-model", lambda c: Trainer(strategy="default", verbose=0).fit(3, (c.x, c.y)), TypeError, "`model`",
     "model of type int", r"a zero-argument function returning one"),
    # evaluate and predict
    ("evaluate-steps-0", lambda c: Trainer(strategy="default").evaluate(c.model, (c.x, c.y), steps=0), ValueError,
     "`steps`", "steps=0", r"Pass a positive number of steps"),
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
        from trainer import checks, data

        checks.check_data(data.as_input((x, y, w), arg="data"), "data", steps_arg=None, steps=None)


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
