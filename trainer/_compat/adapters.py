"""Input forms read through Keras's own data adapters, and what a tf.data graph says of its shuffles.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from typing import Any, Callable

import numpy as np

import keras
import tensorflow as tf

# Input forms -------------------------------------------------------------------
#
# Generators and `keras.utils.PyDataset` are read through Keras's own data
# adapters, so that their batches, steps, workers, queue and epoch hooks are
# those of `model.fit`.

try:  # keras/src/trainers/data_adapters/ (3.0-3.16)
    from keras.src.trainers.data_adapters.generator_data_adapter import GeneratorDataAdapter as _GeneratorAdapter
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter as _PyDatasetAdapter
except ImportError:  # pragma: no cover
    _GeneratorAdapter = _PyDatasetAdapter = None

# Grain's datasets (grain.MapDataset, grain.IterDataset, grain.DataLoader), which model.fit takes since Keras
# 3.10 and which a KerasHub task's own fit makes from arrays when grain is installed:
# keras/src/trainers/data_adapters/grain_dataset_adapter.py and `data_adapters.is_grain_dataset` (3.10-3.16).
try:
    from keras.src.trainers.data_adapters import is_grain_dataset as _is_grain_dataset
    from keras.src.trainers.data_adapters.grain_dataset_adapter import GrainDatasetAdapter as _GrainAdapter
except ImportError:  # Keras before 3.10: model.fit takes no grain dataset either
    _is_grain_dataset = _GrainAdapter = None


def is_grain_dataset(x: Any) -> bool:
    return _is_grain_dataset is not None and bool(_is_grain_dataset(x))


Rows = Callable[[int], "tuple[int, int]"]  # rows in a batch -> [begin, end) of those to read


# A grain MapDataset batched by `.batch(n)` with no `batch_fn` is a BatchMapDataset whose batch i stacks rows
# [i*n, min(len, (i+1)*n)) of its parent with `make_batch` (grain/_src/python/dataset/transformations/batch.py,
# `BatchMapDataset.__getitem__`, grain 0.2.x): its batches can be read record by record. Grain is imported only
# for a grain dataset, which the user's script imported it to make.
def grain_record_batches(adapter: Any) -> Callable[[Rows], tf.data.Dataset] | None:
    """For Keras's adapter of a grain MapDataset batched by `.batch()`: `rows -> ` Keras's own tf.data view of it,
    in which each batch has only rows [begin, end) = rows(batch size) read from its records (the others repeat
    the nearest row read, and no replica of this worker computes on them). None for any other grain dataset.

    The view is the adapter's (its conversions and element signature), over a grain dataset of the same batches,
    so grain's own reading (its threads, its order) serves it.
    """
    try:
        import grain
        from grain._src.python.dataset.transformations.batch import BatchMapDataset, make_batch
    except ImportError:  # a grain whose batching this does not know: its batches are read whole
        return None
    dataset = getattr(adapter, "_dataset", None)
    if type(dataset) is not BatchMapDataset or dataset._batch_fn is not make_batch:
        return None
    parent, batch_size = dataset._parent, dataset._batch_size
    num_records = len(parent)

    def batches(rows: Rows) -> tf.data.Dataset:
        def batch(index: int) -> Any:
            first = index * batch_size
            size = min(num_records, first + batch_size) - first
            begin, end = rows(size)
            read = make_batch([parent[first + row] for row in range(begin, end)])
            if (begin, end) == (0, size):
                return read
            nearest = np.clip(np.arange(size) - begin, 0, end - begin - 1)
            return tf.nest.map_structure(lambda part: np.asarray(part)[nearest], read)

        view = copy.copy(adapter)
        view._dataset = grain.MapDataset.range(len(dataset)).map(batch)
        return view.get_tf_dataset()

    return batches


def keras_adapter(x: Any, *, class_weight: Any = None, shuffle: bool = False) -> Any:
    """Keras's adapter for a generator, PyDataset or grain dataset: `.get_tf_dataset()`, `.num_batches`, epoch
    hooks."""
    if _GeneratorAdapter is None:  # pragma: no cover
        raise RuntimeError("This Keras has no keras.src.trainers.data_adapters; pass a tf.data.Dataset instead.")
    if isinstance(x, keras.utils.PyDataset):
        return _PyDatasetAdapter(x, class_weight=class_weight, shuffle=shuffle)
    if is_grain_dataset(x):
        return _GrainAdapter(x)
    return _GeneratorAdapter(x)


def adapter_warnings(x: Any, shuffle: bool) -> list:
    """The warnings model.fit's data adapters give for a tf.data.Dataset, PyDataset or grain dataset `x` (Keras's
    own `get_data_adapter`, keras/src/trainers/data_adapters/__init__.py: from some version after 3.8, that
    `shuffle` leaves them as they are; for grain, that it ignores `shuffle`). Their adapters only keep `x` when
    made, or read a grain dataset's first batches, which it gives again; generators, whose adapter takes
    batches from the only stream, give none here."""
    if not isinstance(x, (tf.data.Dataset, keras.utils.PyDataset)) and not is_grain_dataset(x):
        return []
    try:
        from keras.src.trainers.data_adapters import get_data_adapter
    except ImportError:  # pragma: no cover
        return []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            get_data_adapter(x, shuffle=shuffle)
        except Exception:  # noqa: BLE001 (what Keras refuses, the trainer's own checks say)
            return []
    return list(caught)


def first_batch(adapter: Any) -> Any:
    """The first batch an adapter yields, read without consuming anything (it was peeked or is indexed)."""
    if isinstance(adapter, _PyDatasetAdapter):
        return adapter._standardize_batch(adapter.py_dataset[0])
    if _GrainAdapter is not None and isinstance(adapter, _GrainAdapter):  # read again: grain's datasets replay
        return next(iter(adapter._dataset))
    return adapter._first_batches[0]


def declared_batch_size(dataset: tf.data.Dataset) -> tuple[bool, int | None]:
    """(batched, batch size) from the `.batch()` in `dataset`'s chain of transformations.

    Walks `_input_dataset` (tf.data's Python classes, TF 2.16-2.22) back from
    the dataset through maps, prefetches, caches and the like, to the last
    `.batch`, `.padded_batch` or `.unbatch`; (False, None) when the chain ends
    without one, or passes through something whose batching it cannot see.
    """
    while dataset is not None:
        name = type(dataset).__name__
        if "Unbatch" in name:
            return False, None
        if "Rebatch" in name:  # batched, to sizes this walk does not read
            return True, None
        size = getattr(dataset, "_batch_size", None)
        if size is not None:
            value = tf.get_static_value(size)
            return True, (int(value) if value is not None and int(value) > 0 else None)
        dataset = getattr(dataset, "_input_dataset", None)
    return False, None


@dataclasses.dataclass(frozen=True)
class KerasView:
    """What Keras's own data handling makes of a tf.data.Dataset, generator, PyDataset or grain dataset."""
    dataset: tf.data.Dataset  # the data as tf.data: the dataset itself, or its adapter's
    adapter: Any = None  # a Python-fed form's adapter: `.num_batches`, its epoch hooks
    first: Any = None  # that adapter's first batch, read without consuming anything
    batched: bool = False  # a tf.data.Dataset's: whether a `.batch()` made its elements
    batch_size: int | None = None  # that `.batch()`'s size, where static
    warnings: tuple = ()  # what model.fit's adapters warn about it, when asked for


def keras_view(x: Any, *, class_weight: Any = None, shuffle: bool = False, warn: bool = False) -> KerasView:
    """Reads `x` as model.fit's data adapters read it; raises their ValueError for data they refuse."""
    caught = tuple(adapter_warnings(x, shuffle)) if warn else ()
    if isinstance(x, tf.data.Dataset):
        batched, batch_size = declared_batch_size(x)
        return KerasView(x, batched=batched, batch_size=batch_size, warnings=caught)
    adapter = keras_adapter(x, class_weight=class_weight, shuffle=shuffle)
    return KerasView(adapter.get_tf_dataset(), adapter, first_batch(adapter), warnings=caught)



def _graph_nodes(dataset: tf.data.Dataset) -> list[tuple[dict, Any]]:
    """(nodes by name, node) for every node of `dataset`'s graph, functions included: `Dataset._as_serialized_graph`
    (2.0-2.22). A graph that cannot be read (a dataset of Python objects) gives none."""
    from tensorflow.core.framework import graph_pb2

    try:
        graph = graph_pb2.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    except Exception:  # noqa: BLE001 (TensorFlow raises various errors for graphs it will not serialize)
        return []
    found = []
    for nodes in [graph.node, *(function.node_def for function in graph.library.function)]:
        by_name = {node.name: node for node in nodes}
        found += [(by_name, node) for node in nodes]
    return found


def _constant(by_name: dict, name: str) -> Any:
    """The TensorProto of the Const node that input `name` comes from, or None."""
    node = by_name.get(name.split(":")[0].lstrip("^"))
    return node.attr["value"].tensor if node is not None and node.op == "Const" else None


def dataset_shuffles(dataset: tf.data.Dataset) -> list[tuple[bool, bool]]:
    """(reshuffles each time it is read, seeded) for each shuffle in `dataset`'s graph, functions included.

    The Shuffle* ops' inputs are (input, buffer_size, seed, seed2, ...): a shuffle is unseeded when both seeds
    are 0 (no op seed, no global seed when the dataset was made).
    """
    found = []
    for by_name, node in _graph_nodes(dataset):
        if not node.op.startswith("Shuffle"):
            continue
        reshuffles = node.attr["reshuffle_each_iteration"].b if "reshuffle_each_iteration" in node.attr else True
        seeds = [_constant(by_name, name) for name in node.input[2:4]]
        seeds = [seed.int64_val[0] if seed is not None and seed.int64_val else None for seed in seeds]
        found.append((reshuffles, seeds != [0, 0]))
    return found


def service_jobs(dataset: tf.data.Dataset) -> list[str]:
    """The tf.data service jobs `dataset` reads from (`tf.data.experimental.service.distribute`), by name: "" for
    a job of each reader's own, else the `job_name` its readers share, each handed other elements of it. The
    DataServiceDataset ops' input named `job_name` (found by their OpDef, TF 2.18-2.22)."""
    from tensorflow.python.framework import op_def_registry

    jobs = []
    for by_name, node in _graph_nodes(dataset):
        if not node.op.startswith("DataServiceDataset"):
            continue
        inputs = [arg.name for arg in op_def_registry.get(node.op).input_arg]
        name = _constant(by_name, node.input[inputs.index("job_name")]) if "job_name" in inputs else None
        jobs.append(name.string_val[0].decode() if name is not None and name.string_val else "")
    return jobs
