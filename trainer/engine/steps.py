"""Replica step functions and the fused loops that run them.

Each train step divides the replica's sample-weighted loss sum by the GLOBAL
example count (a cross-replica sum), so the gradients that Keras's optimizer
sums across replicas equal the single-device gradient of the whole batch,
however unevenly the batch was split. Regularization is divided by the replica
count, so it is added exactly once per global step. How a batch is split, and
a batch smaller than the replica count, are in `feed.Share`.

The loops that run several steps per call are in `fused`.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterator

import keras
import tensorflow as tf

from trainer import _compat
from trainer.data import feed as feed_lib
from trainer.data.readers import ArrayFeed
from trainer.distribute.cluster import is_parameter_server
from trainer.engine import draws, fused
from trainer.engine import objective as objective_lib
from trainer.engine.objective import Objective
from trainer.engine.tracing import graph_function, step_function
from trainer.model.own_steps import ModelSteps


class Steps:
    """Compiled train, eval and predict functions for one model under one strategy.

    Args:
      strategy: the strategy whose scope holds `model` and `optimizer`.
      model: the model in scope.
      objective: the loss and metric trackers, built in scope.
      jit_compile: compile the forward and backward pass with XLA.
      warmup: for a float LR, `(scaled_lr, factor, warmup_steps)` to ramp the
        optimizer's LR variable in-graph; None otherwise.
    """

    def __init__(
        self,
        strategy: tf.distribute.Strategy,
        model: keras.Model,
        objective: Objective,
        *,
        jit_compile: bool = False,
        warmup: tuple[float, float, int] | None = None,
    ):
        self.strategy = strategy
        self.model = model
        self.objective = objective
        self.warmup = warmup
        # Keras variables add by read-modify-write (`assign(self + value)`), so
        # updates from several replicas to one copy get lost: under
        # CentralStorageStrategy (one copy on one device) and parameter-server
        # training (copies on ps tasks). There the replicas return their tensors
        # instead, and the metrics are updated once, away from the replicas.
        self.replica_metrics = not (isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy)
                                    or is_parameter_server(strategy))
        self.model_steps = ModelSteps.of(model)
        if self.model_steps.train and not self.replica_metrics:
            raise ValueError(
                f"{type(model).__name__} has its own train_step, which updates its metrics inside each replica; "
                f"under {type(strategy).__name__} those updates are not kept exactly. Use MirroredStrategy or "
                "MultiWorkerMirroredStrategy, or move the step's logic into compute_loss."
            )
        self.xla = bool(jit_compile)  # the forward and backward pass, one XLA function
        self._grads = graph_function(self._loss_and_grads, jit_compile=True) if jit_compile else self._loss_and_grads
        self._activity_sums = bool(_compat.activity_layers(model))  # Keras < 3.14 sums them over the batch
        self._feed: ArrayFeed | None = None  # the feed that the traced feed loops read when they run
        self._results_made_by: dict[int, tuple[Any, str]] = {}  # while tracing: which metric made each result
        self._traced_step = ""  # while tracing: the model's own step being traced ("train_step", "test_step")
        # Random draws the steps made per replica, not as one device (draws.replica_rows), for later plans.
        self.named_draws: dict[tuple[str, int], str] = {}
        self._train_loops = fused.Loops(self._use_feed, step_function(self._train_feed_loop),
                                  step_function(self._train_global_loop), step_function(self._train_loop))
        self._eval_loops = fused.Loops(self._use_feed, step_function(self._eval_feed_loop),
                                 step_function(self._eval_global_loop), step_function(self._eval_loop))
        predict_batch = step_function(self._predict_step, reduce_retracing=True)
        self._predict_loops = fused.PredictLoops(
            self._use_feed, step_function(self._predict_feed_step),
            global_batch=lambda batch: predict_batch(batch, True),
            replica_batch=lambda batch: predict_batch(batch, False))

    def _use_feed(self, feed: ArrayFeed) -> None:
        self._feed = feed

    def train(self, reader: Any, num_steps: int) -> int:
        """Runs up to `num_steps` train steps from `reader` (see `readers.py`); returns how many ran.

        Fewer run only when the data ended.
        """
        return reader.run(self._train_loops, num_steps)

    def evaluate(self, reader: Any, num_steps: int) -> int:
        """Runs up to `num_steps` evaluation steps; returns how many ran."""
        return reader.run(self._eval_loops, num_steps)

    def predictions(self, reader: Any) -> Iterator[Any]:
        """The model's outputs (NumPy), one global batch of `reader` after another, computed as they are asked for."""
        for out in reader.predictions(self._predict_loops):
            yield tf.nest.map_structure(lambda t: t if isinstance(t, tf.RaggedTensor) else t.numpy(), out)

    # Replica context -------------------------------------------------------

    def _loss_and_grads(self, x, y, sample_weight, global_count, examples=None):
        model, optimizer = self.model, self.model.optimizer
        with tf.GradientTape() as tape:
            # A Loss the model calls in its forward pass (an endpoint layer's add_loss) gives the replica's own
            # mean, as on one device, for `replica_loss` to weigh once: Keras's would come scaled by 1/replicas.
            with _compat.activity_share(model, examples), _compat.replica_share():
                y_pred = model(x, training=True)
            loss, local = self.objective.replica_loss(x, y, y_pred, sample_weight, global_count, training=True)
            scaled = optimizer.scale_loss(loss)
        grads = _compat.gradients(tape, scaled, model.trainable_variables)
        # Masks do not cross a tf.function boundary (with jit_compile); `_with_masks` puts them back.
        return y_pred, objective_lib.flat_masks(y_pred), local, grads

    def train_replica(self, share: feed_lib.Share):
        """One train step on this replica's share of a global step (replica context)."""
        if self.model_steps.train:
            return self._model_step(self.model.train_step, share)
        x, y, sample_weight = objective_lib.unpack(share.batch)
        with draws.replica_rows(share.batch, share.placed, xla=self.xla, named=self.named_draws):
            y_pred, masks, local, grads = self._grads(x, y, sample_weight, share.global_count, self._examples(share))
        if self.model.trainable_variables:
            self.model.optimizer.apply_gradients(zip(grads, self.model.trainable_variables))
        else:  # Keras's words, at trace time as Keras's train_step says them; its metrics still update
            warnings.warn("The model does not have any trainable weights.", stacklevel=2)
        return self._track(share, x, y, objective_lib.with_masks(y_pred, masks), sample_weight, local)

    def eval_replica(self, share: feed_lib.Share):
        """One evaluation step on this replica's share of a global step (replica context)."""
        if self.model_steps.test:
            return self._model_step(self.model.test_step, share)
        x, y, sample_weight = objective_lib.unpack(share.batch)
        with _compat.activity_share(self.model, self._examples(share)), _compat.replica_share(), \
                draws.replica_rows(share.batch, share.placed, named=self.named_draws):
            y_pred = self.model(x, training=False)
        _, local = self.objective.replica_loss(x, y, y_pred, sample_weight, share.global_count, training=False)
        return self._track(share, x, y, y_pred, sample_weight, local)

    def _model_step(self, method, share: feed_lib.Share):
        """The model's own `train_step` or `test_step`, run as Keras runs it in a replica.

        As under `model.fit` with a strategy, each replica steps on its own
        rows only (none, when a batch has fewer examples than there are
        replicas). Keras's losses give the mean over the replica's rows, and
        Keras's optimizer weighs each replica's gradients by its share of the
        global batch before it sums them (`_compat.replica_share`): the
        one-device gradient, also when the shares differ. The metrics are read
        from `model.metrics` across replicas after the call, under the keys
        the step returns them (`Objective.name_logs`).
        """
        batch, placed = share.batch, share.placed
        if share.tracked is not None:
            batch = objective_lib.slice_rows(batch, *share.tracked)
            placed = None if placed is None else (placed[0] + tf.cast(share.tracked[0], tf.int64), placed[1])
        count = objective_lib.rows(batch)
        context = tf.distribute.get_replica_context()
        total = context.all_reduce("SUM", count) if context.num_replicas_in_sync > 1 else count
        examples = total if context.num_replicas_in_sync > 1 else None
        with _compat.replica_share(gradients=tf.math.divide_no_nan(count, total)), \
                _compat.activity_share(self.model, examples), \
                draws.replica_rows(batch, placed, named=self.named_draws):
            logs = method(batch)
        returned = self.objective.name_logs(method.__name__, logs, self._results_made_by)
        self._traced_step = method.__name__  # for `_run`, which holds what the step returned
        # Each replica's value weighed by its share of the global batch: their sum is the one-device value
        # of a mean over the batch (a replica with no rows adds nothing).
        share = tf.math.divide_no_nan(tf.cast(count, tf.float32), tf.cast(total, tf.float32))
        return {key: tf.where(count > 0, tf.cast(value, tf.float32) * share, 0.0) for key, value in returned.items()}

    def _examples(self, share: feed_lib.Share):
        """The examples in the global step (each counted once), for `_compat.activity_share`; None when not needed."""
        context = tf.distribute.get_replica_context()
        if not self._activity_sums or context.num_replicas_in_sync == 1:
            return None
        counted = objective_lib.rows(share.batch) if share.tracked is None else tf.cast(
            share.tracked[1] - share.tracked[0], tf.float32)
        return context.all_reduce("SUM", counted)

    def _track(self, share, x, y, y_pred, sample_weight, local):
        if self.replica_metrics:
            self.objective.track(x, y, y_pred, sample_weight, local, share.tracked)
            return ()
        # Returned across replicas, and from parameter-server workers, whose results hold tensors only.
        if share.tracked is not None:
            y, y_pred, sample_weight = objective_lib.slice_rows((y, y_pred, sample_weight), *share.tracked)
        count = objective_lib.rows(y_pred)
        # Rank 1, so that the replicas' values are concatenated (`_concat_replicas` keeps one scalar).
        gathered = {"y": y, "y_pred": y_pred, "loss_sum": tf.reshape(local * count, [1]),
                    "count": tf.reshape(count, [1]),
                    "masks": {i: m for i, m in enumerate(objective_lib.flat_masks(y_pred)) if m is not None}}
        if sample_weight is not None:
            gathered["sample_weight"] = sample_weight
        return gathered

    def track_gathered(self, y, y_pred, loss_sum, count, masks, sample_weight=None) -> None:
        """Updates the trackers with what `_track` returned from the replicas (cross-replica context)."""
        outputs = tf.nest.flatten(y_pred)
        for i, mask in masks.items():
            _compat.set_keras_mask(outputs[i], mask)
        self.objective.track_loss(tf.reduce_sum(loss_sum), tf.reduce_sum(count))
        self.model.compute_metrics(None, y, y_pred, sample_weight)

    # Cross-replica context ---------------------------------------------------

    def _run(self, replica_fn, *args):
        if self.model_steps.train or self.model_steps.test:
            with _compat.results_recorded(self.model, self._results_made_by):  # read by `_model_step`
                outputs = self.strategy.run(replica_fn, args=args)
            if isinstance(outputs, dict) and outputs:  # values the model's own step returned: the last step's
                self.objective.hold(self._traced_step, self.strategy.reduce("SUM", outputs, axis=None))
        else:
            outputs = self.strategy.run(replica_fn, args=args)
        if not self.replica_metrics:
            self.track_gathered(**tf.nest.map_structure(self._concat_replicas, outputs))

    def _concat_replicas(self, value):
        parts = self.strategy.experimental_local_results(value)
        return parts[0] if parts[0].shape.rank == 0 else tf.concat(parts, axis=0)

    def sync_warmup(self) -> None:
        """Sets a float LR to its warmup value for the coming step (call before training)."""
        if self.warmup is not None:
            self._apply_warmup()

    def _apply_warmup(self):
        # Ramps linearly from scaled_lr / factor; after the ramp the LR is left to the user and callbacks.
        scaled_lr, factor, warmup_steps = self.warmup
        step = tf.cast(self.model.optimizer.iterations, "float32")
        start = 1.0 / factor
        lr = tf.where(step < warmup_steps, scaled_lr * (start + (1.0 - start) * step / warmup_steps), scaled_lr)
        learning_rate = self.model.optimizer.learning_rate
        tf.cond(step <= warmup_steps, lambda: tf.group(learning_rate.assign(lr)), tf.no_op)

    # The phases' loops (`fused`), each traced by `step_function`.

    def _after_train_step(self):
        return self._apply_warmup if self.warmup is not None else None  # the LR of the next step, for callbacks

    def _train_loop(self, iterator, num_steps):
        return fused.on_replica_batches(self._run, self.train_replica, iterator, num_steps, self._after_train_step())

    def _eval_loop(self, iterator, num_steps):
        return fused.on_replica_batches(self._run, self.eval_replica, iterator, num_steps)

    def _train_global_loop(self, iterator, held, num_steps):
        return fused.on_global_batches(self._run, self.train_replica, iterator, held, num_steps,
                                       self._after_train_step())

    def _eval_global_loop(self, iterator, held, num_steps):
        return fused.on_global_batches(self._run, self.eval_replica, iterator, held, num_steps)

    def _train_feed_loop(self, signature, first, count):
        fused.on_feed(self._run, self.train_replica, self._fetch(signature, first, count), signature, count,
                      self._after_train_step())

    def _eval_feed_loop(self, signature, first, count):
        fused.on_feed(self._run, self.eval_replica, self._fetch(signature, first, count), signature, count)

    def _fetch(self, signature, first, count):
        """Each replica's rows of the feed's steps first..first+count-1 (per replica)."""
        def fetch():
            return feed_lib.fetch(lambda: self._feed, first, count, signature)

        return self.strategy.run(fetch)

    def _predict_replica(self, share: feed_lib.Share):
        if self.model_steps.predict:
            batch = share.batch  # the features, packed as Keras packs x alone: a sequence wrapped, else bare
            outputs = self.model.predict_step((batch,) if isinstance(batch, (tuple, list)) else batch)
        else:
            outputs = self.model(share.batch, training=False)
        return tf.nest.map_structure(fused.RaggedParts.of, feed_lib.tracked(share, outputs))

    def _predict_step(self, batch, global_batches: bool):
        def predict(x):
            if global_batches:
                return self._predict_replica(feed_lib.share_of(x))
            return self._predict_replica(x.share() if isinstance(x, feed_lib.Cut) else feed_lib.Share(x, None))

        return self._gathered(self.strategy.run(predict, args=(batch,)))

    def _predict_feed_step(self, signature, step):
        def predict(fetched):
            return self._predict_replica(feed_lib.step_batch(fetched, 0, signature))

        fetched = self._fetch(signature, step, tf.constant(1, tf.int64))
        return self._gathered(self.strategy.run(predict, args=(fetched,)))

    def _gathered(self, per_replica):
        gathered = tf.nest.map_structure(lambda t: self.strategy.gather(t, axis=0), per_replica)
        return fused.RaggedParts.joined(gathered)
