"""Keras's functions replaced while the trainer traces its steps, and put back after.

`_compat.replicas` (Keras's replica scaling, clipping and synchronized
statistics), `_compat.variables` (scalar reads) and `trainer.engine.draws`
(Keras's random functions) each hold a table of attributes to replace. The
replacements call the functions they replaced, which `Patches.originals` keeps
while they are installed. Every table is in `Patches.registry`, so that
`_compat.platform` can say before a call whether each target is there.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, ClassVar, Iterator, Sequence

from .version import TESTED, installed, pip_fix

UNTESTED_OPT_IN = "TRAINER_UNTESTED_VERSIONS"  # "1": train on untested versions, with the hooks that are there


def opted_in() -> bool:
    """Whether the user asked to train on untested versions, or without a hook whose target is gone."""
    return os.environ.get(UNTESTED_OPT_IN, "") == "1"


class Patches:
    """Attributes of Keras's modules and classes, replaced while any caller is inside `installed()`.

    Nested entries share one install, and the originals go back when the
    outermost one leaves.

    Args:
      purpose: what the hooks keep exact, in words, for messages ("the replicas' loss and gradient shares").
      table: (key, owner, attribute name, replacement, where) rows: `where` is the Keras (or TensorFlow) file
        and name the owner comes from, for messages. A row whose replacement is None is only read: its original
        is kept, under its key, for code that replaces it for a moment itself. An owner that could not be
        imported is None.
      originals: key -> the function the row replaced, filled while installed.
      required: without these targets the trainer can't run at all (the route to its steps, `keras_methods`):
        no opt-in trains without them, since Keras's own loop would run in the trainer's place.
    """

    registry: ClassVar[list[Patches]] = []

    def __init__(self, purpose: str, table: Sequence[tuple[str, Any, str, Callable | None, str]],
                 originals: dict[str, Callable], *, required: bool = False):
        self.purpose = purpose
        self.table = tuple(table)
        self.originals = originals
        self.required = required
        self._depth = 0
        Patches.registry.append(self)

    def missing(self) -> list[str]:
        """The targets this Keras lacks, in words ("`_all_reduce_sum_gradients` of TFOptimizer (keras/src/...)")."""
        return [f"`{attribute}` of {where}" for _, owner, attribute, _, where in self.table
                if owner is None or not hasattr(owner, attribute)]

    def refuse_if_missing(self, missing: list[str] | None = None) -> None:
        """Raises RuntimeError naming the missing targets (`missing()`, unless given), the tested versions and
        the fix, where a target of `required` hooks is gone (opted in or not); else returns."""
        if not self.required:
            return
        missing = self.missing() if missing is None else missing
        if missing:
            tested = " and ".join(f"{name} {low[0]}.{low[1]}-{high[0]}.{high[1]}"
                                  for name, (low, high) in TESTED.items())
            found = ", ".join(f"{name} {text}" for name, (text, _) in installed().items())
            raise RuntimeError(
                f"The trainer runs beneath Keras's own fit through {', '.join(missing)}, which this Keras lacks "
                f"(found {found}; tested {tested}), so Keras's own loop would train in its place. Nothing has "
                f"run. Install tested versions ({pip_fix()}); {UNTESTED_OPT_IN}=1 can't stand in for a "
                f"missing route.")

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The replacements in place while inside. A missing target raises RuntimeError, naming it, unless the
        user opted in to untested versions: then none is installed (the replacements call each other's
        originals), and Keras's own functions run."""
        if self._depth == 0:
            self.refuse_if_missing()
            missing = self.missing()
            if missing and not opted_in():
                raise RuntimeError(
                    f"The trainer's hooks for {self.purpose} need {', '.join(missing)}, which this Keras lacks, "
                    f"and without them the replicas' numbers would not be one device's. Install a tested Keras "
                    f"(setup.cfg's range), or set {UNTESTED_OPT_IN}=1 to train without them.")
            for key, owner, attribute, replacement, _ in self._present():
                self.originals[key] = getattr(owner, attribute)
                if replacement is not None:
                    setattr(owner, attribute, replacement)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                for key, owner, attribute, replacement, _ in self._present():
                    original = self.originals.pop(key)
                    if replacement is not None:
                        setattr(owner, attribute, original)

    def _present(self) -> tuple:
        return () if self.missing() else self.table
