"""The model's compiled loss and metrics, evaluated per example inside replicas.

Keras reduces a loss to a per-replica mean, which is wrong once replicas hold
different numbers of examples. Here the loss is kept per example; the step
divides its weighted sum by the global example count, and the reported loss is
the sample-weighted mean over every example seen, tracked by `Mean` metrics
whose variables tf.distribute sums across replicas on read.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from trainer.tracing import graph_function


def _per_example(loss: Any):
    """A callable (y_true, y_pred) -> per-example losses of shape (batch,).

    `Loss.call` gives the unreduced values; the inputs are converted as
    `Loss.__call__` would. Loss objects are not copied: Keras copies go through
    serialization, which fails for unregistered custom losses.
    """
    if not isinstance(loss, keras.losses.Loss):
        loss = keras.losses.get(loss)

    def call(y_true, y_pred):
        if isinstance(loss, keras.losses.Loss):
            dtype = loss.dtype or "float32"
            values = loss.call(tf.cast(y_true, dtype), tf.cast(y_pred, dtype))
        else:
            values = loss(*_same_rank(y_true, y_pred))
        if values.shape.rank and values.shape.rank > 1:  # e.g. per time step
            values = tf.reduce_mean(values, axis=list(range(1, values.shape.rank)))
        return tf.cast(values, "float32")

    return call


def _same_rank(y_true, y_pred):
    """Adds the trailing axis of size 1 that a plain loss function expects on y_true."""
    y_true, y_pred = tf.convert_to_tensor(y_true), tf.convert_to_tensor(y_pred)
    if y_true.shape.rank == y_pred.shape.rank - 1 and y_pred.shape[-1] == 1:
        y_true = tf.expand_dims(y_true, -1)
    return tf.cast(y_true, y_pred.dtype) if y_pred.dtype.is_floating else y_true, y_pred


def _by_output(spec: Any, names: list[str], what: str) -> list[Any]:
    """Spreads a loss or metrics spec (single, list or dict) over the outputs."""
    if isinstance(spec, dict):
        unknown = set(spec) - set(names)
        if unknown:
            raise ValueError(
                f"The compiled {what} names outputs {sorted(unknown)} that the model does not "
                f"have. Model outputs: {names}. Recompile with the model's output names."
            )
        return [spec.get(n) for n in names]
    if isinstance(spec, (list, tuple)) and len(names) > 1 and len(spec) == len(names):
        # A loss or loss-weight list has one entry per output; a metrics list is per output
        # only when its entries are lists (else it is metrics for every output).
        if "metrics" not in what or all(isinstance(s, (list, tuple)) or s is None for s in spec):
            return list(spec)
    return [spec] * len(names)


def _metric(identifier: Any, y_true: tf.Tensor, y_pred: tf.Tensor) -> keras.metrics.Metric:
    """Builds a fresh metric object; "accuracy" is resolved from the shapes as Keras does."""
    if isinstance(identifier, dict):
        return keras.saving.deserialize_keras_object(identifier)
    if isinstance(identifier, keras.metrics.Metric):
        return identifier.__class__.from_config(identifier.get_config())
    if str(identifier).lower() in ("accuracy", "acc"):
        if y_pred.shape[-1] == 1:
            return keras.metrics.BinaryAccuracy(name=identifier)
        if y_true.shape.rank < y_pred.shape.rank or (y_true.shape[-1] == 1 and y_pred.shape[-1] > 1):
            return keras.metrics.SparseCategoricalAccuracy(name=identifier)
        return keras.metrics.CategoricalAccuracy(name=identifier)
    obj = keras.metrics.get(identifier)
    if not isinstance(obj, keras.metrics.Metric):
        name = identifier if isinstance(identifier, str) else getattr(obj, "__name__", "metric")
        obj = keras.metrics.MeanMetricWrapper(obj, name=name)
    return obj


def _identifiers(spec: Any) -> list[Any]:
    """A metrics spec for one output -> its identifiers (a config dict is one identifier)."""
    if spec is None:
        return []
    return list(spec) if isinstance(spec, (list, tuple)) else [spec]


def _as_list(outputs: Any, names: list[str]) -> list[Any]:
    if isinstance(outputs, dict):
        return [outputs[n] for n in names]
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


class Objective:
    """Per-example loss plus exact, replica-summed loss and metric trackers.

    Build it inside `strategy.scope()` so the trackers' variables are
    distributed. `update` runs inside a replica; `results` in cross-replica
    context.

    Args:
      model: a compiled, built Keras model.
      y_true: a sample of targets, to resolve "accuracy" and output order.
      y_pred: the model's output on the matching inputs.
      compile_config: `model.get_compile_config()`, read outside any strategy scope
        (the optimizer given to compile may belong to another strategy).
    """

    def __init__(self, model: keras.Model, y_true: Any, y_pred: Any, compile_config: dict | None = None):
        config = compile_config if compile_config is not None else model.get_compile_config() or {}
        names = list(getattr(model, "output_names", None) or ["output"])
        if len(_as_list(y_pred, names)) != len(names):
            names = [f"output_{i}" for i in range(len(_as_list(y_pred, names)))]
        self.output_names = names
        losses = _by_output(model.loss, names, "loss")
        weights = config.get("loss_weights")
        self._loss_weights = _by_output(weights, names, "loss_weights") if weights else [1.0] * len(names)
        self._losses = [_per_example(l) if l is not None else None for l in losses]

        prefix = (lambda n: f"{n}_") if len(names) > 1 else (lambda n: "")
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.regularization_tracker = keras.metrics.Mean(name="regularization")
        # One per output with a loss, in the order of `per_example_losses`'s per-output values.
        self.output_loss_trackers = (
            [keras.metrics.Mean(name=f"{n}_loss") for n, l in zip(names, losses) if l is not None]
            if len(names) > 1 else []
        )
        self.compiled_metrics: list[tuple[int, bool, keras.metrics.Metric]] = []
        self._read = self._reset = None  # graph calls, see `results`
        yt, yp = _as_list(y_true, names), _as_list(y_pred, names)
        for weighted, key in ((False, "metrics"), (True, "weighted_metrics")):
            for i, spec in enumerate(_by_output(config.get(key), names, key)):
                for identifier in _identifiers(spec):
                    metric = _metric(identifier, tf.convert_to_tensor(yt[i]), yp[i])
                    metric.name = prefix(names[i]) + metric.name
                    if weighted and metric.name in {m.name for _, _, m in self.compiled_metrics}:
                        metric.name = prefix(names[i]) + "weighted_" + metric.name[len(prefix(names[i])):]
                    self.compiled_metrics.append((i, weighted, metric))

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """Every tracker, in the order of the logs."""
        return (
            [self.loss_tracker, self.regularization_tracker]
            + self.output_loss_trackers
            + [m for _, _, m in self.compiled_metrics]
        )

    def per_example_losses(self, y_true: Any, y_pred: Any) -> tuple[tf.Tensor, list[tf.Tensor]]:
        """Total loss per example (loss weights applied) and each output's losses."""
        yt, yp = _as_list(y_true, self.output_names), _as_list(y_pred, self.output_names)
        yp = [_float32(p) for p in yp]  # mixed precision: losses in float32, as Keras computes them
        per_output = [
            fn(t, p) for fn, t, p in zip(self._losses, yt, yp) if fn is not None
        ]
        weights = [w for fn, w in zip(self._losses, self._loss_weights) if fn is not None]
        total = tf.add_n([w * l for w, l in zip(weights, per_output)])
        return total, per_output

    def update(self, y_true, y_pred, weights, losses, per_output, regularization) -> None:
        """Updates every tracker with this replica's examples (replica context).

        Args:
          y_true, y_pred: this replica's targets and the model's outputs.
          weights: one weight per example (ones without sample weights).
          losses, per_output: from `per_example_losses`.
          regularization: the model's regularization loss, or None when it has none.
        """
        weight_sum = tf.reduce_sum(weights)
        _accumulate(self.loss_tracker, tf.reduce_sum(losses * weights), weight_sum)
        if regularization is not None:
            count = tf.cast(tf.shape(losses)[0], "float32")
            _accumulate(self.regularization_tracker, regularization * count, count)
        for tracker, values in zip(self.output_loss_trackers, per_output):
            _accumulate(tracker, tf.reduce_sum(values * weights), weight_sum)
        yt, yp = _as_list(y_true, self.output_names), _as_list(y_pred, self.output_names)
        for i, weighted, metric in self.compiled_metrics:
            metric.update_state(yt[i], yp[i], sample_weight=weights if weighted else None)

    def reset(self) -> None:
        if self._reset is None:
            self._reset = graph_function(lambda: [m.reset_state() for m in self.metrics] and None)
        self._reset()

    def results(self) -> dict[str, float]:
        """Exact results over every example since `reset`, as Python floats."""
        if self._read is None:
            # One graph call reads every tracker (and one resets them): eager reads of
            # distributed variables cost ~1 ms each, and the loop reads after every step call.
            self._read = graph_function(lambda: [m.result() for m in self.metrics])
        loss, regularization, *others = self._read()
        logs = {"loss": float(loss) + float(regularization)}
        for metric, value in zip(self.metrics[2:], others):
            logs[metric.name] = _to_float(value)
        return logs


def _accumulate(tracker: keras.metrics.Mean, total: tf.Tensor, count: tf.Tensor) -> None:
    """Adds a weighted sum and its total weight to a `Mean`.

    What `Mean.update_state(values, sample_weight)` adds, without its per-call
    shape handling: every step runs this, and the sums are at hand.
    """
    tracker.total.assign_add(total)
    tracker.count.assign_add(count)


def _to_float(value: Any) -> Any:
    try:
        return float(value)
    except TypeError:  # a metric with a non-scalar result, e.g. per-class values
        return keras.ops.convert_to_numpy(value).tolist()


def _float32(tensor: tf.Tensor) -> tf.Tensor:
    return tf.cast(tensor, "float32") if tensor.dtype in (tf.float16, tf.bfloat16) else tensor
