"""Who may write: the chief. Works under Trainer.fit and under a plain Model.fit."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
from typing import Callable, Iterator

import keras

from trainer.distribute.cluster import cluster_info


class ContextAware(keras.callbacks.Callback):
    """A callback that reads the trainer's `TrainContext` when `Trainer.fit` provides one.

    Under a plain `Model.fit` there is no context: the task's role then comes
    from TF_CONFIG, and step-level resume is unavailable.
    """

    handles_fused_steps = True  # batch hooks may cover several steps at once

    def __init__(self):
        super().__init__()
        self.context = None

    def set_trainer_context(self, context) -> None:
        self.context = context

    @property
    def is_chief(self) -> bool:
        return self.context.is_chief if self.context is not None else cluster_info().is_chief

    @property
    def epoch_step(self) -> tuple[int, int] | None:
        """(epoch, steps done in it) under Trainer.fit, else None."""
        return (self.context.epoch, self.context.step) if self.context is not None else None


@contextlib.contextmanager
def writable_dir(directory: str, is_chief: bool) -> Iterator[str]:
    """The directory this task writes into: the real one on the chief, a temporary one elsewhere.

    Saving takes every worker in step (the tf.distribute multi-worker
    convention); only the chief's files remain.
    """
    if is_chief:
        os.makedirs(directory, exist_ok=True)
        yield directory
        return
    scratch = tempfile.mkdtemp(prefix="trainer-worker-")
    try:
        yield scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def replace_or_explain(write, final_path: str, *, suffix: str, owner: str, intact: Callable[[], str]) -> None:
    """`replace_atomically`, turning an OSError (a full disk, say) into one that says what is intact.

    Args:
      owner: who writes, e.g. "ModelCheckpoint".
      intact: called after a failure, for a sentence on what survives, e.g.
        "The previous checkpoint ... is intact."
    """
    try:
        replace_atomically(write, final_path, suffix=suffix)
    except OSError as err:
        reason = err.strerror or str(err)
        raise OSError(err.errno, f"{owner} could not write {final_path}: {reason} ({type(err).__name__}: {err}). "
                                 f"{intact()}") from err


def replace_atomically(write, final_path: str, suffix: str = "") -> None:
    """Calls `write(tmp_path)` and renames the result over `final_path`.

    A crash mid-write leaves the previous file intact (a rename within a
    directory is atomic on POSIX); the temporary file is removed on failure.
    The file's data reaches the disk before the rename, and the rename before
    this returns, so a power cut leaves the old file or the new one, never a
    renamed file with nothing in it. A process killed mid-write leaves its
    temporary file (`.NAME.tmp-*`): the next write of the same file removes it.
    """
    directory = os.path.dirname(os.path.abspath(final_path))
    os.makedirs(directory, exist_ok=True)
    prefix = f".{os.path.basename(final_path)}.tmp-"
    for torn in glob.glob(os.path.join(glob.escape(directory), glob.escape(prefix) + "*")):
        with contextlib.suppress(FileNotFoundError):
            os.remove(torn)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
    os.close(fd)
    try:
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, final_path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync(directory)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
