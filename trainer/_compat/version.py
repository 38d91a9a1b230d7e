"""The Keras and TensorFlow versions: the range CI tests, and the gates of what changed within it.
"""

from __future__ import annotations

import functools
from importlib import metadata

import keras
import tensorflow as tf


def _major_minor(text: str) -> tuple[int, int]:
    parts = []
    for part in (text.split(".") + ["0", "0"])[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return parts[0], parts[1]


KERAS_VERSION = _major_minor(keras.version())
TF_VERSION = _major_minor(tf.__version__)

# What CI tests: the oldest tier (.ci/oldest) and setup.cfg's newest. Outside it the trainer refuses to train,
# unless the user opts in (`_compat.platform`).
# Moving the range on a release day: docs/contributors/release_day.md.
TESTED = {"Keras": ((3, 8), (3, 16)), "TensorFlow": ((2, 18), (2, 22))}
OLDEST = {"Keras": "3.8.0", "TensorFlow": "2.18.1"}  # the oldest tier's exact releases (.ci/oldest)
DISTRIBUTIONS = {"Keras": "keras", "TensorFlow": "tensorflow"}


def installed() -> dict[str, tuple[str, tuple[int, int]]]:
    """What the version check reads, at each check: name -> (version text, (major, minor))."""
    return {name: (text, _major_minor(text)) for name, text in (("Keras", keras.version()),
                                                                  ("TensorFlow", tf.__version__))}


# What changed in Keras within the range, and from which version; each gate is read in one place.
KERAS_GE_3_11 = KERAS_VERSION >= (3, 11)  # on_*_batch_end gets a call's last step (`batch_end_index`)
KERAS_GE_3_14 = KERAS_VERSION >= (3, 14)  # an activity regularizer's value is a mean over the batch (`activity`)
KERAS_GE_3_15 = KERAS_VERSION >= (3, 15)  # train_on_batch and test_on_batch reset the metrics first (`keras_methods`)
# keras/src/backend/tensorflow/trainer.py's TensorFlowTrainer is Trainer(BaseTrainer), keras/src/trainers/trainer.py's
# Trainer is BaseTrainer (`keras_methods`); backend/tensorflow/nn.py is backend/tensorflow/ops/nn.py
# (`replicas.batch_norm`); keras.src.backend no longer re-exports the mask functions (`masks`); the one-step
# train function stops before a step on an empty iterator (`keras_methods.one_step_calls_past_end`)
KERAS_GE_3_16 = KERAS_VERSION >= (3, 16)


# tf.data's `Dataset.from_generator` kernel fixes glibc's mmap threshold at 128 KiB for the process
# (`ApplyPython311MemoryPatch`; `trainer/engine/malloc.py` undoes it). Measured: 2.18 leaves it alone, 2.21 fixes it
# (Python 3.11 and 3.13), 2.22.0rc0 leaves it alone again (Python 3.11 and 3.12); 2.19 and 2.20 not measured.
TF_DATA_PINS_MALLOC = (2, 19) <= TF_VERSION < (2, 22)


def untested() -> list[str]:
    """The installed versions outside the tested range, in words ("Keras 3.17.0 (tested 3.8-3.16)"), and a Keras
    whose files two distributions wrote."""
    found = []
    for name, (text, version) in installed().items():
        low, high = TESTED[name]
        if not low <= version <= high:
            found.append(f"{name} {text} (tested {low[0]}.{low[1]}-{high[0]}.{high[1]})")
    owners = keras_owners()
    if len(owners) > 1:
        found.append(f"the keras package written by {' and '.join(owners)}, one over the other (pip uninstall -y "
                     f"keras keras-nightly, then pip install the one your TensorFlow requires: pip show tensorflow)")
    return found


@functools.lru_cache(maxsize=None)
def keras_owners() -> tuple[str, ...]:
    """The installed distributions whose files make the `keras` package ("keras-nightly 3.16.0.dev2026102704"):
    TensorFlow 2.22 brings `keras-nightly`, and a package that requires `keras` (keras-hub, keras-tuner) then
    installs that distribution over the same files. Read once per process: the check runs on every entry, and
    reading the two RECORDs is most of its time."""
    owners = []
    for name in ("keras", "keras-nightly"):
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        if any(line.startswith("keras/__init__.py,") for line in (distribution.read_text("RECORD") or "").splitlines()):
            owners.append(f"{name} {distribution.version}")
    return tuple(owners)


def requirement(name: str) -> str:
    """The tested range of `name` ("Keras", "TensorFlow") as a pip requirement: "tensorflow>=2.18.1,<2.23"."""
    high = TESTED[name][1]
    return f"{DISTRIBUTIONS[name]}>={OLDEST[name]},<{high[0]}.{high[1] + 1}"


def pip_fix() -> str:
    """The pip command that installs tested versions of what is untested here (of both, if neither is)."""
    names = [name for name, (_, version) in installed().items()
             if not TESTED[name][0] <= version <= TESTED[name][1]] or list(TESTED)
    return "pip install " + " ".join(f"'{requirement(name)}'" for name in sorted(names, reverse=True))


def debug_limits() -> tuple[int | None, int | None]:
    """Keras's debugging caps on every fit: `keras.config.set_max_epochs` and `set_max_steps_per_epoch`
    (keras/src/backend/config.py, 3.10-3.16; absent before, where nothing is capped)."""
    from keras.src.backend import config

    def read(name: str) -> int | None:
        getter = getattr(config, name, None)
        return getter() if getter is not None else None

    return read("max_epochs"), read("max_steps_per_epoch")


def batch_end_index(begin: int, steps: int) -> int:
    """The batch index Keras's loops give `on_*_batch_end` for a call of `steps` steps from `begin`: the call's
    last step from Keras 3.11 on (its epoch iterator yields `begin, end`), the step it began at before
    (keras/src/backend/tensorflow/trainer.py, 3.8-3.10: `on_train_batch_end(step, logs)`)."""
    return begin + steps - 1 if KERAS_GE_3_11 else begin
