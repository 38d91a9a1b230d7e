"""Sums and gathers between the replicas of a step, for the hooks that need the global batch's values."""

from __future__ import annotations

import tensorflow as tf

from .shares import factor, times


def in_process(strategy) -> bool:
    """Whether every replica is a CPU of this process, where a sum or gather is plain ops between devices,
    cheaper there than MirroredStrategy's collectives (docs/performance.md: what one device's numbers cost)."""
    return (isinstance(strategy, tf.distribute.MirroredStrategy)
            and all(tf.DeviceSpec.from_string(d).device_type == "CPU" for d in strategy.extended.worker_devices))


def replica_sum(context, value):
    """The replicas' sum of `value`: between CPUs of one process each replica adds the parts itself, in replica
    order, so every replica holds the same bits; elsewhere (GPUs, workers) the strategy's own all-reduce."""
    if not in_process(context.strategy):
        return context.all_reduce(tf.distribute.ReduceOp.SUM, value)
    return _on_each_replica(context, value, tf.add_n)


def gathered(context, value):
    """Every replica's `value`, stacked in replica order (no gradient)."""
    if in_process(context.strategy):
        return _on_each_replica(context, value, tf.stack)
    replicas = context.num_replicas_in_sync  # each part in a slot of its own, and the slots summed
    slot = tf.reshape(tf.one_hot(context.replica_id_in_sync_group, replicas, dtype=value.dtype),
                      [replicas] + [1] * value.shape.rank)
    return context.all_reduce(tf.distribute.ReduceOp.SUM, slot * value[None])


def _on_each_replica(context, value, combine):
    """`combine([part, ...])` of the replicas' parts of `value`, on each replica's own device."""

    def on_each(strategy, parts):
        parts = list(strategy.experimental_local_results(parts))
        results = []
        for device in strategy.extended.worker_devices:
            with tf.device(device):
                results.append(combine(parts))
        return strategy.experimental_distribute_values_from_function(
            lambda replica: results[replica.replica_id_in_sync_group])

    return context.merge_call(on_each, args=(value,))


def replicas():
    """The replica context of a replica of several, else None."""
    context = tf.distribute.get_replica_context()
    return context if context is not None and context.num_replicas_in_sync > 1 else None


def summed(context, grads):
    """The replicas' gradients, each weighed by `replica_share(gradients=...)`, summed (None stays None)."""
    present = [i for i, g in enumerate(grads) if g is not None]
    if not present:  # Keras's own apply then says which variables have no gradient
        return list(grads)
    by = factor("gradients")
    sums = context.all_reduce(tf.distribute.ReduceOp.SUM, [times(grads[i], by) for i in present])
    out = list(grads)
    for i, g in zip(present, sums):
        out[i] = g
    return out
