"""What a dataset the user distributed (`tf.distribute.DistributedDataset`) was made from.

`strategy.experimental_distribute_dataset(ds)` and
`strategy.distribute_datasets_from_function(fn, options)` return objects that
keep their strategy, and the dataset or the function they were made from, in
private attributes: `_strategy`, `_original_dataset` (a DistributedDataset),
`_dataset_fn` and `_options` (tensorflow/python/distribute/input_lib.py,
checked on TF 2.18 and 2.21). TensorFlow's own ClusterCoordinator reads
`_original_dataset` the same way (coordinator/values.py). The trainer reads the
source back and feeds it as it feeds the undistributed forms, so each replica
gets its rows of one device's batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class DistributedSource:
    """A DistributedDataset's strategy, and the batched dataset or the dataset function it distributes."""

    strategy: tf.distribute.Strategy
    dataset: tf.data.Dataset | None = None  # experimental_distribute_dataset's
    fn: Callable[[tf.distribute.InputContext], tf.data.Dataset] | None = None  # distribute_datasets_from_function's
    options: Any = None  # the tf.distribute.InputOptions it was made with, or None


def is_distributed_dataset(x: Any) -> bool:
    """Whether `x` is a dataset distributed by a strategy (either of TensorFlow's two forms)."""
    return isinstance(x, tf.distribute.DistributedDataset)


def distributed_source(x: Any) -> DistributedSource:
    """The strategy and the source of a DistributedDataset; raises TypeError, naming the attribute, for one made
    in a way this TensorFlow keeps otherwise."""
    strategy = getattr(x, "_strategy", None)
    dataset = getattr(x, "_original_dataset", None)
    fn = getattr(x, "_dataset_fn", None)
    if not isinstance(strategy, tf.distribute.Strategy) or (dataset is None) == (fn is None):
        raise TypeError(
            f"The trainer can't read back what this {type(x).__name__} distributes: TensorFlow {tf.__version__} keeps "
            "no `_strategy` with an `_original_dataset` or a `_dataset_fn` in it (read on TF 2.18-2.22). Pass the "
            "tf.data.Dataset itself, or the function input_context -> Dataset, with Trainer(strategy=strategy)."
        )
    return DistributedSource(strategy, dataset, fn, getattr(x, "_options", None))
