"""What a model's `compile` was asked for XLA, and whether Keras lets the model use it.

Keras resolves `compile(jit_compile="auto")` at once and keeps only the result, in `model.jit_compile`: off on a
machine with CPUs only, off for a model made in a distribution strategy's scope ("Disable XLA with
tf.distribute"), else on where `model_supports_jit` allows it (`_resolve_auto_jit_compile`,
keras/src/trainers/trainer.py, 3.8-3.16). An explicit `compile(jit_compile=False)` leaves the same False. So
while the trainer calls a builder, or a `Trainer.distribute()` block runs, the base trainer's `compile` is
wrapped to note the argument it was given (`noted`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import weakref
from typing import Any, Iterator

from .keras_methods import _BASE, _KerasTrainer, _trainers
from .patches import Patches

_WHERE = f"{_BASE} (keras/src/trainers/trainer.py)"
_originals: dict = {}
_notes: list[weakref.WeakKeyDictionary] = []  # the dictionaries that `noted` callers are filling, innermost last


def _compile(self, *args, **kwargs):
    compile_ = _originals["compile"]
    result = compile_(self, *args, **kwargs)
    try:
        asked = inspect.signature(compile_).bind(self, *args, **kwargs).arguments.get("jit_compile", "auto")
    except TypeError:  # arguments the original accepted some other way: nothing to note
        return result
    for notes in _notes:
        notes[self] = asked
    return result


_TARGETS = Patches("the XLA setting a model's compile was given", [
    ("compile", _KerasTrainer, "compile", _compile, _WHERE),
    ("model_supports_jit", _trainers, "model_supports_jit", None, "keras/src/trainers/trainer.py"),
], _originals)
if _KerasTrainer is not None and hasattr(_KerasTrainer, "compile"):
    functools.update_wrapper(_compile, _KerasTrainer.compile)


@contextlib.contextmanager
def noted(notes: weakref.WeakKeyDictionary) -> Iterator[weakref.WeakKeyDictionary]:
    """While inside, each model compiled puts in `notes` (model -> what `jit_compile` was given: True, False
    or "auto", Keras's default)."""
    with _TARGETS.installed():
        _notes.append(notes)
        try:
            yield notes
        finally:
            _notes.remove(notes)


def supports_jit(model: Any) -> bool:
    """Keras's own test of whether XLA can compile `model`: every layer's `supports_jit`, op determinism off,
    and no GPU of an Apple silicon Mac (`model_supports_jit`)."""
    check = getattr(_trainers, "model_supports_jit", None)
    if check is None:  # only with TRAINER_UNTESTED_VERSIONS=1 (`_compat.platform` refuses before a call): no XLA
        return False
    return bool(check(model))


def made_in_strategy_scope(model: Any) -> bool:
    """Whether `model` was made in a distribution strategy's scope: the strategy Keras's backend trainer keeps
    from its `__init__` (`_distribute_strategy`, keras/src/backend/tensorflow/trainer.py, 3.8-3.16), which
    turns compile's "auto" off."""
    if not hasattr(model, "_distribute_strategy"):
        raise RuntimeError(
            f"The trainer reads where a model was made from `_distribute_strategy`, which this Keras's "
            f"{type(model).__name__} lacks, so it cannot tell compile's jit_compile=\"auto\" from an explicit "
            "False. Nothing has run. Pass Trainer(jit_compile=True or False), or install a tested Keras.")
    return model._distribute_strategy is not None
