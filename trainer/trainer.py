"""`Trainer`: fit, evaluate and predict a Keras model under any tf.distribute strategy.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import keras
import numpy as np
import tensorflow as tf

from trainer import _compat, options
from trainer.batching import Batching
from trainer.data import boundary
from trainer.distribute import strategy as strategy_lib
from trainer.distribute.chatter import quiet_tf_info
from trainer.history import History
from trainer.model import models
from trainer.model import route as route_lib
from trainer.runs import Runs
from trainer.strategies import Strategies


# `model.fit`'s global batch for arrays when none is given (keras/src/trainers/trainer.py, 3.8-3.16).
KERAS_BATCH_SIZE = 32


class _Default(str):
    """A default that reads as its value, so that the Trainer can tell it from the same value given."""


class Trainer:
    """Trains a compiled Keras model under a tf.distribute strategy, with exact results.

    Losses and metrics are aggregated across replicas and workers so that, at one
    global batch (`batch_size`), the numbers do not depend on how many devices ran
    the job; `per_replica_batch_size` grows the global batch with the replicas.

    Example:

    ```python
    import keras, numpy as np
    from trainer import Trainer

    trainer = Trainer(strategy="mirrored", per_replica_batch_size=64)  # first, before any TensorFlow work
    x, y = np.random.rand(1000, 8), np.random.randint(0, 2, 1000)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = trainer.fit(model, (x, y), epochs=2)
    ```

    Args:
      strategy: a `tf.distribute.Strategy` or a name from `STRATEGY_NAMES`.
      per_replica_batch_size: examples per replica per step; the global batch is
        this times the replicas in sync. Default 32 when `batch_size` is unset.
      batch_size: a fixed global batch instead. Not both.
      lr_scaling: "auto" (linear for SGD, sqrt for adaptive optimizers),
        "linear", "sqrt" or None.
      base_batch_size: the batch the model's learning rate was tuned for.
        Defaults to `per_replica_batch_size`, or `batch_size` when that is set
        (a fixed global batch then keeps its learning rate).
      warmup_epochs: epochs of linear warmup from the base to the scaled LR.
      warmup_steps: the same in optimizer steps. Not both.
      seed: seeds the per-epoch shuffle of array inputs and a builder's initial
        weights, from generators of the trainer's own: the global ones (`random`,
        `np.random`, Keras's) are left as they were. None: a builder draws from
        the global generators as Keras does, and the shuffle from a seed drawn
        once per Trainer (one worker only: several must agree on an order).
      shuffle: shuffle array inputs each epoch.
      steps_per_execution: steps fused into one `tf.function` call, or "auto":
        sized from the measured step time to ~1 s per call (see `trainer.engine.fusion`);
        1 when a callback has batch-level hooks, 32 across several workers.
      jit_compile: XLA for the forward and backward pass; "auto" turns it on for
        GPUs and TPUs only (it slows CNNs down on CPU), and keeps a model's own
        compile(jit_compile=True or False); the plan's execution row says why.
      mixed_precision: None (float32), "mixed_float16" (GPUs; adds Keras's
        dynamic loss scaling) or "mixed_bfloat16" (TPUs, recent GPUs, CPUs with
        AMX or AVX512_BF16): layers compute in 16 bits, variables and losses
        stay float32. Opt-in; the plan suggests it on such CPUs.
      batch_norm: "global": on several replicas in sync, BatchNormalization
        layers normalize with the global batch's mean and variance, as on one
        device (Keras's `synchronized=True`, set for the call: one small
        round between the replicas per layer each way, forward and backward;
        between workers each round is a collective over the network, docs/performance.md).
        "per_replica": each replica's own share's, as Keras's fit does, for
        speed; the numbers then depend on the replica count.
      verbose: 0 silent, 1 plan and progress bar, 2 plan and one line per epoch
        (chief only).
      nan_guard: stop training at the first non-finite loss (see `trainer.callbacks.NanGuard`).
      data_sharding: how several workers split a tf.data.Dataset. "exact": every
        worker reads every batch and keeps its replicas' share, as the DATA
        policy does: `model.fit`'s numbers, for W times the reading. "files":
        each worker reads only its file shards (`file_shards` canonical shards
        of the dataset's files, each repeated; fit then needs `steps_per_epoch`):
        the same numbers on any number of replicas or workers that divides
        `file_shards`, but not `model.fit`'s batches. A dataset's own
        `auto_shard_policy` wins over both; other inputs are read as before.
      file_shards: the canonical shards of data_sharding="files"; it must divide
        the global batch, and the replica count must divide it.
      tune_malloc: the trainer's one process-wide patch (`trainer.engine.malloc`): raise
        glibc's mmap threshold over the 128 KiB that tf.data pins for the whole
        process, which makes every large allocation fault its pages in again.
        Applied once per process, at the first fit/evaluate/predict; the plan
        says so. False leaves the process as TensorFlow set it.
    """

    def __init__(
        self,
        *,
        strategy: str | tf.distribute.Strategy = "auto",
        per_replica_batch_size: int | None = None,
        batch_size: int | None = None,
        lr_scaling: str | None = _Default("auto"),
        base_batch_size: int | None = None,
        warmup_epochs: float = 0,
        warmup_steps: int = 0,
        seed: int = 0,
        shuffle: bool = True,
        steps_per_execution: int | str = "auto",
        jit_compile: bool | str = "auto",
        mixed_precision: str | None = None,
        batch_norm: str = "global",
        verbose: int = 1,
        nan_guard: bool = True,
        tune_malloc: bool = True,
        data_sharding: str = "exact",
        file_shards: int = 8,
    ):
        strategy_lib.check_strategy_name(strategy)
        options.check_trainer_options(
            per_replica_batch_size=per_replica_batch_size, batch_size=batch_size, base_batch_size=base_batch_size,
            lr_scaling=lr_scaling, warmup_epochs=warmup_epochs, warmup_steps=warmup_steps,
            steps_per_execution=steps_per_execution, jit_compile=jit_compile, mixed_precision=mixed_precision,
            seed=seed, nan_guard=nan_guard, tune_malloc=tune_malloc, batch_norm=batch_norm,
            data_sharding=data_sharding, file_shards=file_shards,
        )
        self._lr_scaling_given = not isinstance(lr_scaling, _Default)  # distribute() scales only when asked
        batching = Batching(self, batch_given=batch_size is not None or per_replica_batch_size is not None,
                            base_given=base_batch_size)
        if batch_size is None and per_replica_batch_size is None:
            per_replica_batch_size = 32
        self.strategy = strategy
        self.per_replica_batch_size = per_replica_batch_size
        self.batch_size = batch_size
        self.lr_scaling = lr_scaling if lr_scaling is None else str(lr_scaling)
        self.base_batch_size = base_batch_size or per_replica_batch_size or batch_size
        self.warmup_epochs = warmup_epochs
        self.warmup_steps = warmup_steps
        self.seed = seed
        self.shuffle = shuffle
        self.steps_per_execution = steps_per_execution
        self.jit_compile = jit_compile
        self.mixed_precision = mixed_precision
        self.batch_norm = batch_norm
        self.verbose = verbose
        self.nan_guard = nan_guard
        self.tune_malloc = tune_malloc
        self.data_sharding = data_sharding
        self.file_shards = file_shards
        self._strategies = Strategies()
        # Resolve now: multi-worker strategies must be created before TensorFlow runs any op. Where the process
        # runs one made elsewhere, a model built in its scope trains on it (`Strategies.for_call`); other calls
        # refuse.
        try:
            quiet_tf_info(self._strategies.resolve)(strategy)  # TensorFlow's "Using MirroredStrategy" line
        except strategy_lib.AnotherMultiWorker:
            pass
        # The shuffle's seed: the user's, else drawn once from the OS (not from the global generators).
        shuffle_seed = seed if seed is not None else int(np.random.SeedSequence().entropy % 2**32)
        self._batching = batching
        self._runs = Runs(self, batching, shuffle_seed=shuffle_seed)

    # Public API ----------------------------------------------------------------

    @quiet_tf_info
    def fit(
        self,
        model: models.ModelOrBuilder,
        x: Any = None,
        y: Any = None,
        *,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: int | str | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool | None = None,
        class_weight: dict[int, float] | None = None,
        sample_weight: Any = None,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int | Sequence[int] = 1,
        strategy: str | tf.distribute.Strategy | None = None,
    ) -> History:
        """Trains `model` on the data; returns a `History` whose `.model` is the trained model.

        Takes what `model.fit` takes, with the model first: `trainer.fit(model, x, y, batch_size=64,
        epochs=3, validation_split=0.1, class_weight=..., callbacks=[...])` gives `model.fit`'s numbers on
        any strategy.

        Args:
          model: a compiled `keras.Model`, or a zero-argument function that builds
            and compiles one (called inside the strategy's scope).
          x: features with `y` given; or alone, `(x, y[, sample_weight])` arrays, a
            `tf.data.Dataset` (batched: its batches are the global batches; unbatched:
            the trainer batches it), a generator of batches, a `keras.utils.PyDataset`,
            or a function `input_context -> Dataset`.
          y: targets, for arrays.
          sample_weight: per-example weights, for arrays.
          batch_size: the global batch for arrays and unbatched datasets in this
            call; it wins over the Trainer's batch settings (the plan says so), and
            the learning rate is then left as compiled.
          epochs: the epoch to stop after (as in Keras, counted from 0).
          verbose: overrides the trainer's verbosity for this call (Keras's "auto" is 1).
          callbacks: `keras.callbacks.Callback` instances.
          validation_split: the last fraction of the arrays' rows, taken before
            shuffling, to validate on.
          validation_data: validated at the end of every `validation_freq`-th epoch;
            any form `x` takes, or `(x, y[, sample_weight])`.
          shuffle: shuffle arrays each epoch (a PyDataset's batch order); default: the Trainer's.
          class_weight: {class index: weight}; classes left out weigh 1.0.
          initial_epoch: the epoch to start from.
          steps_per_epoch: cap on steps per epoch; needed for infinite data.
          validation_steps: cap on validation steps.
          validation_batch_size: the global batch for validation arrays (default: training's).
          validation_freq: validate after every this many epochs, or after the epochs listed (from 1).
          strategy: overrides the trainer's strategy for this call.
        """
        return self._through_model("fit", model, strategy, route_lib.passed_arguments(Trainer.fit, locals()))

    @quiet_tf_info
    def evaluate(
        self,
        model: models.ModelOrBuilder,
        x: Any = None,
        y: Any = None,
        *,
        batch_size: int | None = None,
        verbose: int | None = None,
        sample_weight: Any = None,
        steps: int | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        return_dict: bool = False,
        strategy: str | tf.distribute.Strategy | None = None,
    ) -> float | list[float] | dict[str, float]:
        """Returns the loss and metrics, exact over every example of the data, as `model.evaluate` does.

        Takes what `model.evaluate` takes, with the model first, and returns what it returns: a float
        when there is one value, else a list in Keras's order (`model.metrics_names`); with
        `return_dict=True`, {metric name: value}. `verbose` as Keras's ("auto" or 1: a progress bar; 0:
        silent); unset, the Trainer's.
        """
        return self._through_model("evaluate", model, strategy, route_lib.passed_arguments(Trainer.evaluate, locals()))

    @quiet_tf_info
    def predict(
        self,
        model: models.ModelOrBuilder,
        x: Any,
        *,
        batch_size: int | None = None,
        verbose: int | None = None,
        steps: int | None = None,
        callbacks: Sequence[keras.callbacks.Callback] | None = None,
        strategy: str | tf.distribute.Strategy | None = None,
    ) -> Any:
        """Returns the model's outputs as NumPy, one row per input row, in input order (as `model.predict`).

        `x` is arrays, a dataset, a generator or a PyDataset of features (the
        features of `(x, y)` elements are used). `callbacks` get the predict hooks as under
        `model.predict`, each batch's outputs in `on_predict_batch_end`'s logs. `verbose` as Keras's
        ("auto" or 1: a progress bar; 0: silent); unset, the Trainer's.
        """
        return self._through_model("predict", model, strategy, route_lib.passed_arguments(Trainer.predict, locals()))

    @contextlib.contextmanager
    def distribute(self, strategy: str | tf.distribute.Strategy | None = None) -> Iterator[Trainer]:
        """Inside the block, every Keras model's own `fit`, `evaluate` and `predict` run on this trainer.

        A tool that calls `model.fit` (a KerasTuner search, a script's own
        function) then trains under the trainer's strategy and exact
        aggregation, with no line changed; on this thread only, until the block ends.
        The calls keep `model.fit`'s contract: arrays without a `batch_size` get
        Keras's global batch of 32 (unless the Trainer was given a batch), the
        learning rate stays as compiled (unless the Trainer was given
        `lr_scaling`), and the Trainer adds no callback that changes what the
        user's see (no NaN guard: Keras's `TerminateOnNaN` is the user's choice).
        What the block adds is the strategy, exact aggregation and the plan,
        printed once per fit at verbose 1 or 2.

        ```python
        with trainer.distribute():
            tuner.search(x, y, epochs=3, validation_split=0.2)
        ```
        """
        strategy_lib.check_strategy_name(strategy)
        _compat.check_platform()  # before the route: a Keras it can't reach refuses here, not in Keras's own loop

        def engine(method: str, model: keras.Model, arguments: dict[str, Any]) -> Any:
            if (method in ("fit", "evaluate", "predict") and arguments.get("batch_size") is None
                    and not self._batching.batch_given and boundary.is_arrays(arguments.get("x"))):
                arguments = {**arguments, "batch_size": KERAS_BATCH_SIZE}
            run = quiet_tf_info(self._engine_for(method))
            keras_defaults = {"guard": False, "scale_lr": self._lr_scaling_given} if method == "fit" else {}
            on = self._call_strategy(strategy, model, arguments)
            return run(model, strategy=on, **arguments, **keras_defaults)

        with route_lib.routed(route_lib.Route(engine)), _compat.compile_noted(self._runs.in_scope.jit_asked):
            yield self

    # The route from Keras's methods to the runs ---------------------------------

    def _call_strategy(self, strategy, model: Any = None, arguments: dict[str, Any] | None = None
                       ) -> tf.distribute.Strategy:
        """The strategy a call runs on (`Strategies.for_call`): the call's `strategy`, else the Trainer's."""
        return self._strategies.for_call(self.strategy if strategy is None else strategy, model, arguments)

    def _engine_for(self, method: str) -> Callable[..., Any]:
        """What runs beneath Keras's `method` (`Runs`), which trainer/model/route.py names when a model's own
        method reaches Keras's."""
        runs = self._runs
        return {
            "fit": runs.fit, "evaluate": runs.evaluate, "predict": runs.predict,
            "train_on_batch": runs.train_on_batch, "test_on_batch": runs.test_on_batch,
            "predict_on_batch": runs.predict_on_batch,
        }[method]

    def _through_model(self, method: str, model: Any, strategy: Any, arguments: dict[str, Any]) -> Any:
        """The model's own `method` called with the arguments given, Keras's own `method` running this trainer's
        engine (trainer/model/route.py); a builder, or anything but a Keras model, goes to the engine directly.

        Arrays get the Trainer's global batch as `batch_size` unless one was
        given, so that a model's own method that batches them (a KerasHub
        task) makes the Trainer's batches.
        """
        _compat.check_platform()  # first: a Keras the route can't reach would run its own loop instead
        strategy = self._call_strategy(strategy, model, arguments)
        run = self._engine_for(method)
        if not _compat.is_model(model):
            return run(model, strategy=strategy, **arguments)
        planned = None
        if (arguments.get("batch_size") is None and boundary.is_arrays(arguments.get("x"))
                and route_lib.accepts(getattr(model, method), "batch_size")):
            planned = self._batching.plan(strategy)[0].global_batch_size
            arguments = {**arguments, "batch_size": planned}

        def engine(name: str, routed: keras.Model, handed: dict[str, Any]) -> Any:
            if planned is not None and handed.get("batch_size") == planned:
                del handed["batch_size"]  # handed down as it was passed: the Trainer's own plan
            return self._engine_for(name)(routed, strategy=strategy, planned_batch=planned, **handed)

        return route_lib.call_model(model, method, arguments, engine)

