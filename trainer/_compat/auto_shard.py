"""tf.data's file-level auto-sharding, for one shard of a dataset's files.

`tf.distribute` shards a dataset across workers with a graph rewrite that
finds the dataset's file source and keeps every N-th file
(`tensorflow/python/data/experimental/ops/distribute.py`, `_AutoShardDataset`,
checked on TF 2.18, 2.21 and 2.22; `tf.distribute`'s own `input_ops.auto_shard_dataset`
calls it). The trainer calls it for canonical shards of its own
(`Trainer(data_sharding="files")`), which no public API offers: `Dataset.shard`
keeps every N-th element, after reading them all.
"""

from __future__ import annotations

import tensorflow as tf

try:
    from tensorflow.python.data.experimental.ops.distribute import _AutoShardDataset
except ImportError:  # pragma: no cover - checked on TF 2.18, 2.21 and 2.22
    _AutoShardDataset = None


def file_shard(dataset: tf.data.Dataset, num_shards: int, index: int) -> tf.data.Dataset:
    """The elements of `dataset` read from its files number index, index + num_shards, ... (as tf.data's FILE
    policy gives a worker): raises `tf.errors.NotFoundError` when iterated if the dataset reads no files."""
    if _AutoShardDataset is None:  # pragma: no cover
        raise RuntimeError(
            f"TensorFlow {tf.__version__} has no _AutoShardDataset (read on TF 2.18-2.22), which "
            "Trainer(data_sharding='files') shards files with. Use data_sharding='exact'."
        )
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.FILE
    return _AutoShardDataset(dataset.with_options(options), num_shards, index, 1)
