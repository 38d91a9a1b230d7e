"""ParameterServerStrategy: asynchronous steps scheduled by a ClusterCoordinator.

Training follows the asynchronous model of TF's parameter-server training (and
MXNet's dist_async KVStore): the coordinator (chief) schedules single steps;
whichever worker is free runs one on its own copy of the data, reading and
updating the variables on the ps tasks. Each worker reads its own shard of the
training data, shuffled and repeated, so an epoch is a number of steps, not an
exact pass.

The epoch loop is `loop.run_epochs`, as for every strategy; `ScheduledSteps`
is what runs a call's worth of steps here. Evaluation and prediction run inline
on the coordinator, with trackers that live there, so their numbers are exact.
Callbacks run on the coordinator.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import tensorflow as tf

from trainer import _compat
from trainer.data import feed as feed_lib
from trainer.data.inputs import Input
from trainer.data.passes import Passes
from trainer.engine.steps import Steps
from trainer.engine.tracing import step_function
from trainer.engine.tracing import graph_function


def per_worker_iterator(strategy, coordinator, inp: Input, global_batch_size: int, num_workers: int):
    """An iterator over per-worker datasets: each worker reads its own stream (`inp.per_worker_dataset`)."""
    shipped = _shipped(inp)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return shipped().per_worker_dataset(ctx, num_workers, global_batch_size).prefetch(tf.data.AUTOTUNE)

    @graph_function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    return iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))


def _shipped(inp: Input) -> Callable[[], Input]:
    """`inp` as the workers can rebuild it: a tf.data.Dataset made on the coordinator travels as its graph.

    The per-worker function runs on the workers, and a dataset it captured
    from the coordinator would reach them as a variant tensor, which does not
    cross processes ("Unable to parse tensor proto"). As TensorFlow's own
    `create_per_worker_dataset(dataset)` does, the dataset is written out as a
    graph here (`DatasetToGraphV2`, its captured tensors included) and read
    back where the function runs (`DatasetFromGraph`). Arrays and dataset
    functions build their datasets on the worker already.
    """
    dataset = getattr(inp, "dataset", None)
    if dataset is None:
        return lambda: inp
    graph = tf.raw_ops.DatasetToGraphV2(input_dataset=tf.data.experimental.to_variant(dataset),
                                        external_state_policy=_WARN, strip_device_assignment=True)
    spec = dataset.element_spec

    def rebuilt() -> Input:
        copy = tf.data.experimental.from_variant(tf.raw_ops.DatasetFromGraph(graph_def=graph), structure=spec)
        return dataclasses.replace(inp, dataset=copy)

    return rebuilt


_WARN = 0  # DatasetToGraphV2's external_state_policy: warn of state (a seedless shuffle's) that starts again


class ScheduledSteps:
    """Train steps scheduled on the workers, a call's worth at a time (`loop.run_epochs`'s step source).

    Training metrics are kept on the coordinator, in the evaluation trackers
    (`eval_steps.objective`; see Steps.replica_metrics), which validation only
    resets after the epoch's train logs are read.
    """

    def __init__(self, coordinator, steps: Steps, eval_steps: Steps, iterator, passes: Passes):
        if passes.epoch_steps is None:
            raise ValueError(
                "Parameter-server training needs a known epoch length. Received data of unknown size. "
                "Pass steps_per_epoch to fit()."
            )
        self.coordinator, self.steps, self.eval_steps, self.iterator = coordinator, steps, eval_steps, iterator
        self.objective = eval_steps.objective
        self.passes = passes  # every worker repeats its shard: the pass never ends, and an epoch is a step count
        self._counter = None
        self._iterations = 0

        @step_function
        def scheduled_step(per_worker):
            # Returns the step's labels, outputs and losses, for exact metrics on the coordinator.
            return steps.strategy.run(lambda batch: steps.train_replica(feed_lib.whole_share(batch)),
                                      args=(next(per_worker),))

        self._scheduled_step = scheduled_step

    def begin(self, context) -> None:
        """After `on_train_begin` (a resumed run has restored the optimizer's step count)."""
        self._counter = _compat.step_counter(self.steps.model.optimizer)
        self._iterations = int(self._counter.numpy())

    @contextlib.contextmanager
    def epoch(self, epoch: int, first_step: int):
        self.passes.begin_epoch(epoch, first_step)
        yield self.run

    def run(self, num_steps: int) -> int:
        """Schedules `num_steps` steps and waits for them; returns them (the data never ends)."""
        results = [self.coordinator.schedule(self._scheduled_step, args=(self.iterator,)) for _ in range(num_steps)]
        self.coordinator.join()  # also re-raises a failed step's error here
        for result in results:
            self.eval_steps.track_gathered(**tf.nest.map_structure(tf.convert_to_tensor, result.fetch()))
        # Concurrent workers lose some of Keras's read-modify-write increments; set the true count.
        self._iterations += num_steps
        self._counter.assign(self._iterations)
        self.steps.sync_warmup()  # a float LR's warmup moves once per call here
        return num_steps

    def end(self) -> None:
        pass
