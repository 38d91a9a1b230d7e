"""Keras's functions replaced while the trainer traces its steps, and put back after.

`_compat.replicas` (Keras's replica scaling, clipping and synchronized
statistics) and `trainer.engine.draws` (Keras's random functions) each hold a table of
attributes to replace. The replacements call the functions they replaced,
which `Patches.originals` keeps while they are installed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence


class Patches:
    """Attributes of Keras's modules and classes, replaced while any caller is inside `installed()`.

    Nested entries share one install, and the originals go back when the
    outermost one leaves.

    Args:
      table: (key, owner, attribute name, replacement) rows. A row whose
        replacement is None is only read: its original is kept, under its key,
        for code that replaces it for a moment itself.
      originals: key -> the function the row replaced, filled while installed.
    """

    def __init__(self, table: Sequence[tuple[str, Any, str, Callable | None]], originals: dict[str, Callable]):
        self.table = tuple(table)
        self.originals = originals
        self._depth = 0

    def supported(self) -> bool:
        """Whether every owner is there and has its attribute (this Keras has what the table replaces)."""
        return all(owner is not None and hasattr(owner, attribute) for _, owner, attribute, _ in self.table)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        if self._depth == 0:
            for key, owner, attribute, replacement in self.table:
                self.originals[key] = getattr(owner, attribute)
                if replacement is not None:
                    setattr(owner, attribute, replacement)
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                for key, owner, attribute, replacement in self.table:
                    original = self.originals.pop(key)
                    if replacement is not None:
                        setattr(owner, attribute, original)
