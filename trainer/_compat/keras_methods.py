"""Keras's own fit, evaluate and predict, routed to the trainer's engine while a trainer call runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Callable

from .patches import Patches
from .version import KERAS_GE_3_15, KERAS_GE_3_16


# Keras's own fit, evaluate and predict ---------------------------------------------
#
# `Trainer.fit(model, ...)` calls `model.fit(...)`, so that what a model's class
# overrides (a KerasHub task's preprocessing) and what a library patches onto
# `keras.Model.fit` (MLflow's autologging) still run; where that chain reaches
# Keras's backend method, the trainer's engine takes over (trainer/model/route.py).
# The backend methods are `TensorFlowTrainer.fit`, `evaluate` and `predict`
# (keras/src/backend/tensorflow/trainer.py, 3.8-3.16: `Trainer` from 3.16; with `train_on_batch`
# and its kin), the first three wrapped by
# `traceback_utils.filter_traceback`, whose closure holds the method itself. A
# patch such as MLflow's keeps the wrapper it found, so the hook goes inside
# it: the closure's cell gets the dispatcher, and every holder of the wrapper
# reaches it. Where the wrapper is not there, the class attribute is replaced
# instead (a patch made before then keeps Keras's own method). Hooked only
# while a trainer call or `Trainer.distribute()` is under way, then put back.

# Keras 3.16 renamed both classes: the backend's TensorFlowTrainer is `Trainer(base_trainer.BaseTrainer)`, and
# keras/src/trainers/trainer.py's `Trainer` (the base of every backend's trainer) is `BaseTrainer`.
_BACKEND, _BASE = ("Trainer", "BaseTrainer") if KERAS_GE_3_16 else ("TensorFlowTrainer", "Trainer")
_BACKEND_FILE = f"{_BACKEND} (keras/src/backend/tensorflow/trainer.py)"
try:
    from keras.src.backend.tensorflow import trainer as _tf_trainer
except ImportError:  # pragma: no cover - `_compat.platform` names it before a call
    _tf_trainer = None
try:
    from keras.src.trainers import trainer as _trainers
except ImportError:  # pragma: no cover
    _trainers = None
_TFTrainer = getattr(_tf_trainer, _BACKEND, None)
_KerasTrainer = getattr(_trainers, _BASE, None)  # what has Keras's own fit

# Read, not replaced: listed so that `_compat.platform` checks that they are there before a call. `required`: the
# route is how the trainer runs at all, so no opt-in trains without it (Keras's own loop would run instead).
_TARGETS = Patches("Keras's fit, evaluate and predict, routed to the trainer's steps",
                   [("backend_trainer", _tf_trainer, _BACKEND, None, "keras/src/backend/tensorflow/trainer.py"),
                    ("keras_trainer", _trainers, _BASE, None, "keras/src/trainers/trainer.py")]
                   + [(name, _TFTrainer, name, None, _BACKEND_FILE) for name in
                      ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")],
                   {}, required=True)


def is_model(obj) -> bool:
    """Whether `obj` has Keras's own fit: a `keras.Model`, or any object that mixes in Keras's backend trainer
    (Keras's own tests train `class ExampleModel(Trainer, layers.Dense)`), as opposed to a builder function."""
    _TARGETS.refuse_if_missing()
    return isinstance(obj, _KerasTrainer)

# fit, evaluate, predict, and the per-batch methods a model's own loop could call instead
KERAS_METHODS = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")
_hook_lock = threading.Lock()
_hook_users = 0
_unhook: list[Callable[[], None]] = []


def _hook_one(name: str, dispatch: Callable) -> Callable[[], None]:
    """Points Keras's backend method `name` at `dispatch(name, method, model, args, kwargs)`; returns the undo."""
    wrapper = _TFTrainer.__dict__[name]
    cells = [cell for cell in (getattr(wrapper, "__closure__", None) or ())
             if inspect.isfunction(cell.cell_contents) and cell.cell_contents.__name__ == name]

    def hooked_for(method):
        @functools.wraps(method)
        def hooked(self, *args, **kwargs):
            return dispatch(name, method, self, args, kwargs)
        return hooked

    if len(cells) == 1:
        cell, method = cells[0], cells[0].cell_contents
        cell.cell_contents = hooked_for(method)
        return lambda: setattr(cell, "cell_contents", method)
    setattr(_TFTrainer, name, hooked_for(wrapper))
    return lambda: setattr(_TFTrainer, name, wrapper)


@contextlib.contextmanager
def keras_methods_hooked(dispatch: Callable):
    """While inside (on any thread), Keras's own `fit`, `evaluate` and `predict` on the TensorFlow backend call
    `dispatch(name, keras_method, model, args, kwargs)` instead; nested and concurrent uses share one hook."""
    global _hook_users
    _TARGETS.refuse_if_missing()
    with _hook_lock:
        if _hook_users == 0:
            _unhook[:] = [_hook_one(name, dispatch) for name in KERAS_METHODS]
        _hook_users += 1
    try:
        yield
    finally:
        with _hook_lock:
            _hook_users -= 1
            if _hook_users == 0:
                while _unhook:
                    _unhook.pop()()


def one_step_calls_past_end() -> bool:
    """Whether Keras's one-step train function (`steps_per_execution=1`) runs a step on the empty iterator of a
    pass of unknown length, which moves each optimizer's counter and SeedGenerator without a batch: 3.8-3.15,
    where the compiled step calls `iterator.get_next()`; from 3.16 it asks `get_next_as_optional()` first and
    stops before the step (keras/src/backend/tensorflow/trainer.py, `_make_function`)."""
    return not KERAS_GE_3_16


def warns_when_unknown_size_ends() -> bool:
    """Whether Keras's fit warns that the input "ran out of data" when data of unknown size ends an epoch without
    `steps_per_epoch`: 3.8-3.15; from 3.16 running out is how such an epoch ends, and only an epoch cut short
    of `steps_per_epoch` warns (keras/src/trainers/epoch_iterator.py, `catch_stop_iteration`)."""
    return not KERAS_GE_3_16


def on_batch_resets_metrics() -> bool:
    """Whether Keras's `train_on_batch` and `test_on_batch` reset the metrics before their batch, so that each
    call logs its own batch alone: from Keras 3.15 (`self.reset_metrics()`); 3.8-3.14 let them accumulate
    across calls."""
    return KERAS_GE_3_15
