"""The input kinds as one type (`Input`), and `Readers`, which makes what a step call reads from an input.

`trainer/data/boundary.py` wraps what the user passed as one of these kinds; from then on the trainer asks the
kind, never its type: what differs between the kinds is the kinds' own (`trainer/data/input_kind.py` says what
each answers). The kinds and their contracts: docs/design.md, "The input kinds".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from trainer.data import arrays as arrays_lib
from trainer.data import feed, marks
from trainer.data import readers as readers_lib
from trainer.data.array_input import ArrayInput
from trainer.data.dataset_inputs import BatchedInput, DatasetInput, DatasetKind, shard_policy
from trainer.data.pipeline_inputs import FileShardsInput, FunctionInput
from trainer.data.specs import has_composite
from trainer.distribute.cluster import strategy_cluster_info


Input = ArrayInput | DatasetInput | BatchedInput | FunctionInput | FileShardsInput


class Readers:
    """Makes what step calls read from an input, for one strategy and global batch.

    `readers(inp, epoch=None, start_step=0, until=None)`: with `epoch`, arrays
    are shuffled per epoch (from `seed`) and one reader covers epochs `epoch`
    to `until` (exclusive; one epoch by default); without it, they are read
    once in input order. `start_step` skips global steps at the start (a
    resumed run).
    """

    def __init__(self, strategy: tf.distribute.Strategy, global_batch_size: int, *, shuffle: bool, seed: int):
        self.strategy = strategy
        self.global_batch_size = global_batch_size
        self.shuffle, self.seed = shuffle, seed
        cluster = strategy_cluster_info(strategy)
        self.num_workers = cluster.num_workers
        local = strategy.num_replicas_in_sync // self.num_workers
        self._worker_replicas = range(cluster.rank * local, (cluster.rank + 1) * local)
        self.in_step = readers_lib.reads_in_step(strategy)  # CPU replicas read in the step, not through tf.distribute
        # A dataset read from its start is distributed once and iterated again each epoch:
        # distributing it rewrites its graph, which costs milliseconds each time.
        self._distributed: list[tuple[Input, Any]] = []

    def __call__(self, inp: Input, epoch: int | None = None, start_step: int = 0, until: int | None = None,
                 place: marks.Place | None = None):
        if place is not None:  # a fit a callback resumes: the kinds that can mark their reads take it
            return inp.reader(self, epoch, start_step, until, place=place)
        return inp.reader(self, epoch, start_step, until)

    @property
    def layout(self) -> tuple[int, int]:
        """(replicas, workers) of the strategy."""
        return self.strategy.num_replicas_in_sync, self.num_workers

    def read_on(self, batches: tf.data.Dataset, place: marks.Place) -> readers_lib.DistributedBatches:
        """TensorFlow's distributed iterator over global batches read on from a marked iterator of `batches`
        put at `place`, each replica handed the share the trainer cuts (`feed.cut_shares`)."""
        iterator, mark = marks.iterator_at(batches, place)
        read = marks.read_on(iterator)
        dataset = self.strategy.distribute_datasets_from_function(lambda context: feed.cut_shares(read, context))
        return readers_lib.DistributedBatches(iter(dataset), composite=has_composite(batches.element_spec),
                                              mark=mark)

    def worker_rows(self, size: int) -> tuple[int, int]:
        """[begin, end) of the rows of a global batch of `size` examples that this worker's replicas compute on."""
        return arrays_lib.computed_rows(size, self._worker_replicas, self.strategy.num_replicas_in_sync)

    def order(self, num_examples: int, *, per_epoch: bool) -> arrays_lib.OrderFn:
        """epoch -> the order of the examples: each epoch's, from the seed (when shuffling); else as given."""
        if not per_epoch:
            return lambda epoch: np.arange(num_examples)
        return lambda epoch: arrays_lib.epoch_order(num_examples, shuffle=self.shuffle, seed=self.seed, epoch=epoch)

    def distributed(self, inp: DatasetKind, start_step: int, *, cut: bool) -> readers_lib.DistributedBatches:
        """TensorFlow's distributed iterator over `inp`'s global batches: each replica handed the share the
        trainer cuts (`feed.cut_shares`) with `cut`, else split by the dataset's own shard policy."""
        if start_step == 0:
            for known, dataset in self._distributed:
                if known is inp:
                    return readers_lib.DistributedBatches(iter(dataset), composite=has_composite(inp.example_spec))
        if cut:
            batches = inp.worker_batches(self, start_step)
            dataset = self.strategy.distribute_datasets_from_function(lambda context: feed.cut_shares(batches, context))
        else:
            policy, _ = shard_policy(inp.dataset, self.num_workers)
            options = tf.data.Options()
            options.experimental_distribute.auto_shard_policy = policy
            dataset = self.strategy.experimental_distribute_dataset(
                inp.global_batches(self.global_batch_size, start_step).with_options(options))
        if start_step == 0:
            self._distributed.append((inp, dataset))
        return readers_lib.DistributedBatches(iter(dataset), composite=has_composite(inp.example_spec))
