"""A tf.data iterator's state as bytes, and back: the place of a pipeline that a backup holds.

`tf.train.Checkpoint(iterator=...)` saves an iterator with the SerializeIterator op on the iterator's resource
and restores it with DeserializeIterator (`iterator_ops.OwnedIterator._serialize_to_tensors`, TF 2.18-2.22).
The trainer runs the same ops on `OwnedIterator._iterator_resource` itself, so that it can keep a state in
memory from the moment it is taken (a pass's start) to the backup that writes it, without files of its own.
The state holds what the pipeline's ops hold: a shuffle's seeds and buffer, a prefetch's buffer, a cache's
contents, a repeat's count. Ops whose state lives outside tf.data (a Python generator, a py_function, a
stateful random op in a map) make the FAIL policy refuse: such a pipeline has no state to save
(`unsaved_state` tells before anything reads).
"""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from .patches import Patches

try:
    from tensorflow.python.data.ops import iterator_ops
    from tensorflow.python.ops import gen_dataset_ops
except ImportError:  # pragma: no cover
    iterator_ops = gen_dataset_ops = None

_WHERE = "tensorflow/python/ops/gen_dataset_ops.py"
_TARGETS = Patches("a tf.data pipeline's place, which a backup holds", [
    ("serialize", gen_dataset_ops, "serialize_iterator", None, _WHERE),
    ("deserialize", gen_dataset_ops, "deserialize_iterator", None, _WHERE),
    ("owned", iterator_ops, "OwnedIterator", None, "tensorflow/python/data/ops/iterator_ops.py"),
], {})

_FAIL = tf.data.experimental.ExternalStatePolicy.FAIL


def unsaved_state(dataset: tf.data.Dataset) -> str:
    """"" where tf.data can save the state of `dataset`'s iterators; else TensorFlow's reason, in its words.

    `Dataset._as_serialized_graph` with the FAIL policy (TF 2.18-2.22), which reads no element: it refuses a
    graph with state outside tf.data, as SerializeIterator would.
    """
    try:
        dataset._as_serialized_graph(external_state_policy=_FAIL)
    except (tf.errors.FailedPreconditionError, tf.errors.InvalidArgumentError) as err:
        # "{{function_node ...}} Failed to serialize the input pipeline graph: EagerPyFunc is stateful. [Op:...]"
        reason = err.message.split("\n")[0].split("graph: ")[-1].split(" [Op:")[0].strip().rstrip(".")
        return re.sub(r"\{\{[^}]*\}\}\s*", "", reason)
    return ""


def _resource(iterator: Any) -> Any:
    resource = getattr(iterator, "_iterator_resource", None)
    if resource is None or _TARGETS.missing():
        missing = ", ".join(_TARGETS.missing()) or "`_iterator_resource` of OwnedIterator"
        raise RuntimeError(
            f"The trainer saves a tf.data pipeline's place through {missing} "
            f"(TensorFlow 2.18-2.22), which this TensorFlow lacks ({type(iterator).__name__} {tf.__version__}), "
            "so a backup could not resume its epoch exactly. Nothing has trained. Install a tested TensorFlow "
            "(setup.cfg's range), or train without BackupAndRestore.")
    return resource


def save(iterator: Any) -> bytes:
    """The state of `iterator` (a `tf.data.Iterator` made by `iter(dataset)`), as bytes."""
    variant = gen_dataset_ops.serialize_iterator(_resource(iterator), _FAIL.value)
    return tf.io.serialize_tensor(variant).numpy()


def restore(iterator: Any, state: bytes) -> None:
    """Puts `iterator` (a fresh iterator of a dataset with the graph of the one `state` was saved from) in
    that place. A pipeline whose ops differ raises `tf.errors.OpError`."""
    with tf.device(iterator._iterator_resource.device):
        gen_dataset_ops.deserialize_iterator(_resource(iterator), tf.io.parse_tensor(state, tf.variant))
