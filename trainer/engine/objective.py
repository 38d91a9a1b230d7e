"""The model's own loss and metrics, as `model.fit` computes them, exact across replicas.

The loss is the model's `compute_loss` and the metrics its `compute_metrics`, run on each replica as on one
device, so the metrics' names, and the callbacks that look them up, are Keras's. What changes is only the weight
of a replica's loss: its share of the global batch, n_r / N (for a masked output, its unmasked count over the
global one), never Keras's 1/replicas. Why that gives one device's loss and gradients: docs/exactness.md,
"The loss: each replica weighed by its share".
"""

from __future__ import annotations

import re
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer import _compat
from trainer.data.arrays import row_slice
from trainer.engine.tracing import graph_function
from trainer.model import placement
from trainer.model.own_steps import ModelSteps


def unpack(batch: Any) -> tuple[Any, Any, tf.Tensor | None]:
    """(x,), (x, y) or (x, y, sample_weight) -> (x, y or None, sample_weight or None), as Keras unpacks.

    Anything else is x alone: features with no targets (a GAN's images, a model trained on its add_loss).
    """
    if not isinstance(batch, (tuple, list)):
        return batch, None, None
    if 1 <= len(batch) <= 3:
        return (*batch, None, None)[:3]
    raise ValueError(
        "Training and evaluation data must yield x, (x,), (x, y) or (x, y, sample_weight). "
        f"Received an element with structure {tf.nest.map_structure(lambda t: t.shape, batch)}."
    )


def with_masks(y_pred, masks):
    """`y_pred` with the Keras masks `flat_masks` read put back (they do not cross a tf.function boundary)."""
    for tensor, mask in zip(tf.nest.flatten(y_pred), masks):
        if mask is not None:
            _compat.set_keras_mask(tensor, mask)
    return y_pred


def flat_masks(y_pred: Any) -> list[Any]:
    return [_compat.get_keras_mask(t) for t in tf.nest.flatten(y_pred)]


def rows(x: Any) -> tf.Tensor:
    """The number of examples in a batch `x`, as float32."""
    return tf.cast(tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0], tf.float32)


def slice_rows(values: Any, begin: tf.Tensor, end: tf.Tensor) -> Any:
    """values[begin:end] for every tensor in `values`, keeping their Keras masks."""
    def cut(t):
        if t is None:
            return None
        part = row_slice(t, begin, end)
        mask = _compat.get_keras_mask(t)
        if mask is not None:
            _compat.set_keras_mask(part, mask[begin:end])
        return part

    return tf.nest.map_structure(cut, values)


class Objective:
    """The model's loss and metrics for one strategy: per-replica loss weights, trackers, results.

    Args:
      model: the compiled model, built and in `strategy`'s scope (`placement.move_in`).
      strategy: the strategy whose replicas run the steps.
    """

    def __init__(self, model: keras.Model, strategy: tf.distribute.Strategy):
        self.model = model
        self.strategy = strategy
        self.loss_tracker = _compat.loss_tracker(model)
        self.model_steps = ModelSteps.of(model)
        self._read = self._read_states = self._reset = None
        # The metrics' variables as one device holds them, as of the last `results(keep_states=True)`.
        self.states: list[np.ndarray] | None = None
        self._log_sources: dict[str, dict[str, str | None] | None] = {}  # by the model's own step: `name_logs`
        self._held: dict[str, dict[str, tf.Variable]] = {}  # the last step's other returned values, by method

    # Replica context ------------------------------------------------------------------

    def replica_loss(self, x, y, y_pred, sample_weight, global_count, training: bool):
        """(this replica's part of the global batch's loss, the replica's own mean loss).

        The parts sum to the one-device loss of the global batch over the
        replicas; `global_count` is `feed.Share.global_count`.
        """
        count = rows(x)
        sample_weight = self._mask_weights(y_pred, sample_weight, count, global_count)
        # Each output's loss tracker (multi-output models) takes this replica's mean of that output, weighed by
        # its rows, so that it logs a mean over examples, as the total loss does.
        with _compat.replica_share(output_losses=(_compat.compile_loss(self.model), count)):
            if self.model_steps.loss:
                local = _compat.compute_loss(self.model, x, y, y_pred, sample_weight, training)
            else:
                local = self._compute_loss(y, y_pred, sample_weight)
        local = tf.cast(local, tf.float32)
        return local * (count / global_count), local

    def _compute_loss(self, y, y_pred, sample_weight):
        """`Model.compute_loss` as Keras has it, with every term cast to float32 before the sum.

        Under mixed precision an activity regularizer's loss is 16-bit and a
        weight regularizer's float32; Keras's own sum fails on the mix.
        """
        terms = []
        compiled = _compat.compile_loss(self.model)
        if compiled is not None:
            value = compiled(y, y_pred, sample_weight)
            if value is not None:
                terms.append(value)
        terms += list(self.model.losses)
        if not terms:
            raise ValueError("No loss to compute. Provide a `loss` argument in `compile()`.")
        return tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in terms])

    def _mask_weights(self, y_pred, sample_weight, count, global_count):
        """Sample weights that make each masked output's mean a mean over the global unmasked count."""
        masks = flat_masks(y_pred)
        if all(m is None for m in masks):
            return sample_weight
        valid = tf.stack([tf.reduce_sum(tf.cast(m, tf.float32)) if m is not None else count for m in masks])
        context = tf.distribute.get_replica_context()
        global_valid = context.all_reduce("SUM", valid) if context.num_replicas_in_sync > 1 else valid
        # mean over this replica's unmasked entries * factor * count / global_count = sum / global unmasked
        factors = tf.math.divide_no_nan(valid * global_count, count * global_valid)
        base = 1.0 if sample_weight is None else sample_weight
        outputs = tf.nest.flatten(y_pred)
        if len(outputs) == 1:
            return base * factors[0]
        weights = [base * factors[i] for i in range(len(outputs))]
        if isinstance(y_pred, dict):
            return dict(zip(sorted(y_pred), weights))  # tf.nest flattens dicts in sorted key order
        return weights

    def track(self, x, y, y_pred, sample_weight, local_loss, tracked) -> None:
        """Updates the loss tracker and the model's metrics with the rows this replica counts.

        Args:
          local_loss: the replica's own mean loss (`replica_loss`'s second value).
          tracked: [begin, end) of the rows the replica counts (`feed.Share.tracked`), or None for all.
        """
        if tracked is not None:
            x, y, y_pred, sample_weight = slice_rows((x, y, y_pred, sample_weight), *tracked)
        self.track_loss(local_loss * rows(y_pred), rows(y_pred))
        self.model.compute_metrics(x, y, y_pred, sample_weight)

    def track_loss(self, weighted_sum, count) -> None:
        # What `Mean.update_state(loss, sample_weight=count)` adds, without its shape handling.
        self.loss_tracker.total.assign_add(tf.cast(weighted_sum, self.loss_tracker.total.dtype))
        self.loss_tracker.count.assign_add(tf.cast(count, self.loss_tracker.count.dtype))

    # Cross-replica context --------------------------------------------------------------

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        return self.model.metrics

    def reset(self) -> None:
        if self._reset is None:
            self._reset = graph_function(lambda: self.model.reset_metrics())
        self._reset()

    def name_logs(self, method: str, logs: Any, made_by: dict[int, tuple[Any, str]]) -> dict[str, Any]:
        """While the model's own `method` traces: the keys it returned, and the metric each reads. Returns the
        values that are no metric's result, by key, to be held (`hold`)."""
        sources = ModelSteps.log_sources(method, logs, self.model, made_by)
        self._log_sources[method] = sources
        return ModelSteps.returned_values(logs, sources)

    def hold(self, method: str, values: dict[str, Any]) -> None:
        """Keeps the step's returned `values` (cross-replica context, in the traced step): `results` logs the
        last step's, as model.fit logs what the step returned. Each is held in a variable made the first time
        (lifted out of the trace)."""
        held = self._held.setdefault(method, {})
        for key, value in values.items():
            if key not in held:
                with self.strategy.scope(), tf.init_scope():
                    held[key] = tf.Variable(tf.zeros(value.shape, tf.float32), trainable=False, shape=value.shape,
                                            name="returned_" + re.sub(r"[^A-Za-z0-9_.]", "_", str(key)))
            held[key].assign(value)

    def results(self, method: str = "train_step", keep_states: bool = False) -> dict[str, Any]:
        """The model's metrics over every example since `reset`, as Python values, under the keys that
        `model.fit` logs after `method` (the model's own step may name them: `name_logs`). With `keep_states`,
        the same graph call also reads every metric's variables into `states` (a backup's, to resume them)."""
        if keep_states:
            if self._read_states is None:
                self._read_states = graph_function(lambda: (
                    tf.nest.map_structure(_read, self.model.get_metrics_result()),
                    [placement.one_device_value(_compat.backing(v)) for v in self.model.metrics_variables]))
            read, states = self._read_states()
            self.states = [np.asarray(state) for state in states]
        else:
            if self._read is None:
                # One graph call reads every tracker: eager reads of distributed variables cost
                # a dispatch each, and the loop reads after every step call.
                self._read = graph_function(lambda: tf.nest.map_structure(_read, self.model.get_metrics_result()))
            read = self._read()
        values = {name: _to_python(value) for name, value in read.items()}
        sources = self._log_sources.get(method)
        if sources is None:
            return values
        held = self._held.get(method, {})
        return {key: values[source] if source is not None else _to_python(_read(held[key]))
                for key, source in sources.items() if source is not None or key in held}

    def states_fit(self, states: list[np.ndarray]) -> bool:
        """Whether `states` (a backup's `states`) has a value of the right shape for every metric variable."""
        variables = self.model.metrics_variables
        return len(states) == len(variables) and all(
            tuple(np.shape(state)) == tuple(variable.shape) for state, variable in zip(states, variables))

    def restore_states(self, states: list[np.ndarray], is_chief: bool) -> None:
        """Puts `states` (`states_fit`) back in the metrics, after a `reset`: a metric then reads as it did when
        they were kept, on any layout (a total goes to the chief's first replica, zeros to the others)."""
        for variable, state in zip(self.model.metrics_variables, states, strict=True):
            placement.fill(_compat.backing(variable), tf.constant(state, variable.dtype), first_holds_sum=is_chief)


def _read(value: Any) -> Any:
    # A metric may return a variable as its result; converting a replica-synced one as the
    # graph's output would read one replica's copy, so read it here, summed.
    return value.read_value() if hasattr(value, "read_value") else value


def _to_python(value: Any) -> Any:
    """As Keras's logs give a value (`pythonify_logs`, 3.8-3.16): a float where it has one element, else the NumPy
    array (a metric with a vector result, e.g. F1Score's per-class values)."""
    value = keras.ops.convert_to_numpy(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return value
