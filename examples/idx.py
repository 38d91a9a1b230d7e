"""A small, strict reader (and writer) for the IDX files MNIST and Fashion-MNIST ship in.

Format: a 4-byte magic number (two zero bytes, a type code, the number of
dimensions), one big-endian uint32 per dimension, then the data in row-major
order. Only unsigned bytes (type 0x08) are used by these data sets.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np

UBYTE = 0x08
IMAGES_MAGIC = 0x0803  # ubyte, 3 dimensions
LABELS_MAGIC = 0x0801  # ubyte, 1 dimension


class IDXError(ValueError):
    """An IDX file is malformed; the message names the file."""


def _open(path: str):
    return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")


def read_idx(path: str | os.PathLike, *, expected_magic: int) -> np.ndarray:
    """Reads one IDX file (optionally gzipped) and checks magic, dimensions and size."""
    path = os.fspath(path)
    try:
        with _open(path) as f:
            raw = f.read()
    except FileNotFoundError:
        raise IDXError(f"{path}: file not found.") from None
    except (OSError, EOFError) as err:
        raise IDXError(f"{path}: can't be read ({err}); is it a truncated or non-gzip file?") from err
    if len(raw) < 4:
        raise IDXError(f"{path}: {len(raw)} bytes is too short for an IDX header.")
    zero, dtype, ndim = struct.unpack(">HBB", raw[:4])
    magic = (dtype << 8) | ndim
    if zero != 0 or magic != expected_magic:
        raise IDXError(f"{path}: magic number 0x{zero:04x}{magic:04x}, expected 0x0000{expected_magic:04x}.")
    if dtype != UBYTE:
        raise IDXError(f"{path}: data type 0x{dtype:02x}, expected unsigned bytes (0x08).")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise IDXError(f"{path}: header cut short ({len(raw)} bytes, need {header}).")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    size = int(np.prod(dims))
    if len(raw) - header != size:
        raise IDXError(f"{path}: {len(raw) - header} data bytes for dimensions {dims}, expected {size}.")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Writes a uint8 array as an IDX file (gzipped if the name ends in .gz)."""
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise TypeError(f"write_idx writes uint8 arrays. Received dtype {array.dtype}.")
    header = struct.pack(">HBB", 0, UBYTE, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())


FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}


def load_dataset(directory: str | os.PathLike, *, num_classes: int = 10):
    """Reads the four standard files from `directory`: ((x_train, y_train), (x_test, y_test)), uint8."""
    parts = {}
    for key, name in FILES.items():
        magic = IMAGES_MAGIC if key.endswith("images") else LABELS_MAGIC
        parts[key] = read_idx(os.path.join(directory, name), expected_magic=magic)
    for split in ("train", "test"):
        images, labels = parts[f"{split}_images"], parts[f"{split}_labels"]
        path = os.path.join(directory, FILES[f"{split}_labels"])
        if images.shape[1:] != (28, 28):
            raise IDXError(f"{os.path.join(directory, FILES[f'{split}_images'])}: images are "
                           f"{images.shape[1:]}, expected 28x28.")
        if len(labels) != len(images):
            raise IDXError(f"{path}: {len(labels)} labels for {len(images)} images.")
        if labels.size and labels.max() >= num_classes:
            raise IDXError(f"{path}: label {labels.max()} is out of range 0..{num_classes - 1}.")
    return (parts["train_images"], parts["train_labels"]), (parts["test_images"], parts["test_labels"])
