"""ParameterServerStrategy: asynchronous steps scheduled by a ClusterCoordinator.

Training follows the asynchronous model of TF's parameter-server training (and
MXNet's dist_async KVStore): the coordinator (chief) schedules single steps;
whichever worker is free runs one on its own copy of the data, reading and
updating the variables on the ps tasks. Each worker reads its own shard of the
training data, shuffled and repeated, so an epoch is a number of steps, not an
exact pass.

Evaluation and prediction run inline on the coordinator, with trackers that
live there, so their numbers are exact. Callbacks run on the coordinator.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from trainer import _compat
from trainer import feed as feed_lib
from trainer.inputs import Input
from trainer.loop import TrainContext, end_epoch, end_training
from trainer.steps import Steps, step_function
from trainer.tracing import graph_function


def is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
    return isinstance(strategy, tf.distribute.ParameterServerStrategy)


def per_worker_iterator(strategy, coordinator, inp: Input, global_batch_size: int, num_workers: int):
    """An iterator over per-worker datasets: each worker reads its own stream (`inp.per_worker_dataset`)."""

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return inp.per_worker_dataset(ctx, num_workers, global_batch_size).prefetch(tf.data.AUTOTUNE)

    @graph_function
    def per_worker_dataset_fn():
        return strategy.distribute_datasets_from_function(dataset_fn)

    return iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))


def run_epochs(
    coordinator,
    steps: Steps,
    eval_steps: Steps,
    context: TrainContext,
    callbacks: keras.callbacks.CallbackList,
    iterator,
    validation: Any,
) -> dict[str, Any]:
    """Schedules `steps_per_epoch` steps per epoch, a call's worth at a time; validates inline."""
    plan, model = context.plan, steps.model
    if plan.steps_per_epoch is None:
        raise ValueError(
            "Parameter-server training needs a known epoch length. Received data of unknown size. "
            "Pass steps_per_epoch to fit()."
        )

    @step_function
    def scheduled_step(per_worker):
        # Returns the step's labels, outputs and losses, for exact metrics on the coordinator.
        return steps.strategy.run(lambda batch: steps.train_replica(feed_lib.whole_share(batch)),
                                  args=(next(per_worker),))

    # Training metrics are kept on the coordinator (see Steps.replica_metrics), in
    # the evaluation trackers, which validation only resets after the train logs are read.
    objective = eval_steps.objective
    model.stop_training = False
    callbacks.on_train_begin()
    steps.sync_warmup()
    counter = _compat.step_counter(model.optimizer)
    iterations = int(counter.numpy())
    logs: dict[str, Any] = {}
    for epoch in range(context.initial_epoch, context.epochs):
        context.epoch, context.step = epoch, context.initial_step if epoch == context.initial_epoch else 0
        objective.reset()
        callbacks.on_epoch_begin(epoch)
        while context.step < plan.steps_per_epoch and not model.stop_training:
            n = min(plan.steps_per_execution, plan.steps_per_epoch - context.step)
            callbacks.on_train_batch_begin(context.step)
            results = [coordinator.schedule(scheduled_step, args=(iterator,)) for _ in range(n)]
            coordinator.join()  # also re-raises a failed step's error here
            for result in results:
                eval_steps.track_gathered(**tf.nest.map_structure(tf.convert_to_tensor, result.fetch()))
            # Concurrent workers lose some of Keras's read-modify-write increments; set the true count.
            iterations += n
            counter.assign(iterations)
            steps.sync_warmup()  # a float LR's warmup moves once per call here
            context.examples_seen += context.examples_in(n, context.step)
            context.step += n
            callbacks.on_train_batch_end(context.step - 1, objective.results())
        logs = end_epoch(epoch, objective, eval_steps, validation, callbacks)
        if model.stop_training:
            break
    end_training(model, context, callbacks, logs)
    return logs
