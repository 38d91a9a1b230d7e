"""Keras's own tests that pass on Keras alone but not beneath the trainer, each with the layouts it fails on and
why (tests/keras/test_keras_suite.py holds the suite to this list, and fails when a listed test passes, so the
list only shrinks; docs/keras_tests.md says how the suite runs)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Excused:
    """Why a test does not pass beneath the trainer, and where.

    Attributes:
      reason: the cause, and where the behaviour a user meets is tested instead.
      replicas: the layouts it fails on: "1" (one device), "2" (2 replicas).
      full_tier: its file runs in the full tier only (TRAINER_TESTS=full).
    """

    reason: str
    replicas: tuple[str, ...] = ("1", "2")
    full_tier: bool = False


# Test ids without their file (`Class::test`); a `*` stands for any parametrization.
EXCUSED = {
    "FunctionalTest::test_warning_for_mismatched_inputs_structure": Excused(
        "each replica traces the model, and `pytest.warns`, which shows every warning, sees Keras's warning on the "
        "inputs' structure once per replica. Under Python's default filter, as a user sees it, it shows once "
        "(tests/data/test_dict_inputs.py).", replicas=("2",), full_tier=True),
}


def excused(replicas: str, *, full: bool) -> set[str]:
    """The patterns excused on `replicas` ("1", "2") in this tier (`full`: TRAINER_TESTS=full)."""
    return {pattern for pattern, why in EXCUSED.items() if replicas in why.replicas and (full or not why.full_tier)}
