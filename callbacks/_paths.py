"""Output paths are checked when a callback is created, so a bad one fails before training starts."""

from __future__ import annotations

import os
import tempfile

from trainer.distribute.cluster import cluster_info


def checked_path(path, *, arg: str, owner: str, is_dir: bool) -> str:
    """Returns `path` as a string; raises unless the chief can create or replace it.

    A missing directory is fine (it is created at the first save), but a path
    under a file, a directory given for a file (or the reverse), or a location
    where no file can be created is refused. Other workers write to temporary
    directories, so they don't check.
    """
    what = "directory" if is_dir else "file path"
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`{arg}` must be a {what} (str or os.PathLike) for {owner}. Received: {arg}={path!r} "
                        f"of type {type(path).__name__}. Pass e.g. {arg}='runs/exp1'.")
    path = os.fspath(path)
    if not path:
        raise ValueError(f"`{arg}` must be a {what} for {owner}. Received: {arg}=''. Pass e.g. {arg}='runs/exp1'.")
    if not cluster_info().is_chief:
        return path
    if os.path.exists(path) and os.path.isdir(path) != is_dir:
        found = "a directory" if os.path.isdir(path) else "a file"
        raise ValueError(f"`{arg}` must be a {what} for {owner}. Received: {arg}={path!r}, which is {found}. "
                         f"Pass a {what} that is not taken.")
    parent = os.path.abspath(path if is_dir else os.path.dirname(os.path.abspath(path)))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"`{arg}` must be a path where {owner} can create its {what.split()[0]}. Received: "
                         f"{arg}={path!r}, but {parent!r} is a file. Pass a path whose parents are directories.")
    if not _can_create_files_in(parent):
        raise ValueError(f"`{arg}` must be a writable {what} for {owner}. Received: {arg}={path!r}, but no file "
                         f"can be created in {parent!r} (read-only or no permission). Pass a writable location, "
                         "or fix its permissions.")
    return path


def _can_create_files_in(directory: str) -> bool:
    # Try it: permission bits don't tell for root or read-only file systems.
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def checked_frequency(value, *, arg: str, example: int) -> int | str:
    """Returns `value` if it is "epoch" or a positive number of steps; raises ValueError otherwise."""
    if value != "epoch" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(
            f"`{arg}` must be 'epoch' or a positive integer of steps. Received: {arg}={value!r}. "
            f"Pass {arg}='epoch', or a step count such as {arg}={example}."
        )
    return value
