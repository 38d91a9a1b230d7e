"""Whether this process can keep the trainer's promise: tested Keras and TensorFlow, every hook's target there.

The trainer gives one device's numbers through hooks into Keras's and
TensorFlow's private code (`Patches.registry`), each checked on the range CI
tests (`version.TESTED`). Outside that range, or with a target gone, the first
entry (fit, evaluate, predict, `distribute()`) refuses, unless the user opts in
(TRAINER_UNTESTED_VERSIONS=1): then it trains, with the hooks whose targets are
there, and the plan says what is no longer guaranteed. The route to the
trainer's own steps is never optional: without it Keras's loop would train.
"""

from __future__ import annotations

from .patches import UNTESTED_OPT_IN, Patches, opted_in
from .version import TESTED, pip_fix, untested


def _range(name: str) -> str:
    (low_major, low_minor), (high_major, high_minor) = TESTED[name]
    return f"{name} {low_major}.{low_minor}-{high_major}.{high_minor}"


def check() -> str:
    """'' where the trainer is tested and every hook's target is there. Else, when the user opted in, the plan's
    note of what differs; otherwise raises RuntimeError naming what was found, the tested range and the way out."""
    gaps = [(patches, patches.missing()) for patches in Patches.registry]
    for patches, targets in gaps:
        patches.refuse_if_missing(targets)  # the route to the trainer's steps: no opt-in runs without it
    versions = untested()
    missing = [(patches.purpose, targets) for patches, targets in gaps if targets]
    if not versions and not missing:
        return ""
    found = "; ".join([*versions, *(f"no {', '.join(targets)}" for _, targets in missing)])
    if not opted_in():
        raise RuntimeError(
            f"The trainer gives one device's numbers through hooks into Keras's and TensorFlow's own code, tested on "
            f"{_range('Keras')} and {_range('TensorFlow')}, and can't promise them here. Found: {found}. Install "
            f"tested versions ({pip_fix()}), or set "
            f"{UNTESTED_OPT_IN}=1 to train anyway: the plan then says which hooks are in place.")
    lost = (f"; without hooks for {', '.join(purpose for purpose, _ in missing)}, these follow Keras's own "
            "per-replica arithmetic" if missing else "; every hook is in place")
    return (f"untested ({UNTESTED_OPT_IN}=1): {found}{lost}; the numbers are not guaranteed to be one device's")
