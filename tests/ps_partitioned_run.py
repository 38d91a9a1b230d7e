"""Fits under a ParameterServerStrategy with a variable partitioner, which the trainer refuses.

Usage: python ps_partitioned_run.py   (run under `trainer-launch --workers 1 --ps 1`)
"""

import os
import sys

import tensorflow as tf

from trainer import Trainer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny import tiny_data, tiny_model  # noqa: E402

partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(min_shard_bytes=64, max_shards=2)
strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver(),
                                                 variable_partitioner=partitioner)
x, y, w = tiny_data(64)
model = tiny_model()
try:
    Trainer(strategy=strategy, verbose=0).fit(model, (x, y, w))
except ValueError as err:
    print("refused:", err, flush=True)
    print("untouched:", not model.optimizer.built, flush=True)
