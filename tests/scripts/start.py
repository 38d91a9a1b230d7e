"""What every test script does before TensorFlow starts: TensorFlow's C++ logs at errors only, the tests'
helpers (tests/helpers/) importable, and the logical CPU devices of the layout it simulates; and its
arguments, read by argparse from the usage in its docstring.

    from start import arguments, start
    args = arguments(__doc__, ("out", str), ("replicas", int))
    start(cpus=args.replicas)
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HELPERS = Path(__file__).resolve().parent.parent / "helpers"
# Options the layout scripts share, for `arguments(..., options=(REPLICAS, REFERENCE))`.
REPLICAS = ("--replicas", {"type": int, "default": 1, "help": "CPU replicas per process"})
REFERENCE = ("--reference", {"action": "store_true", "help": "model.fit on one device, without the trainer"})
WRITE = ("--write", {"action": "store_true", "help": "write the data files and exit"})


def arguments(doc: str, *positional: tuple, options: tuple = (), argv: list[str] | None = None) -> argparse.Namespace:
    """The script's arguments: `positional` as (name, type) or (name, type, nargs), `options` as (flag, kwargs);
    `doc`, the script's docstring, is its --help."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, kind, *nargs in positional:
        parser.add_argument(name, type=kind, **({"nargs": nargs[0]} if nargs else {}))
    for flag, kwargs in options:
        parser.add_argument(flag, **kwargs)
    return parser.parse_args(argv)


def start(cpus: int = 0) -> None:
    """Before TensorFlow initialises its devices: quiet C++ logs, the helpers on sys.path, and `cpus` logical
    CPU devices (0: the machine's one, as TensorFlow makes it)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if str(HELPERS) not in sys.path:
        sys.path.insert(0, str(HELPERS))
    if cpus:
        import tensorflow as tf

        tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                                   [tf.config.LogicalDeviceConfiguration()] * cpus)


def user_strategy(replicas: int, *, reference: bool = False):
    """The strategy a user's script makes before anything else (a multi-worker strategy must exist before
    TensorFlow runs an op): none for the one-device reference, a MultiWorkerMirroredStrategy under TF_CONFIG
    (as trainer-launch sets it), else a MirroredStrategy over `replicas` CPUs. Call after `start`."""
    import tensorflow as tf

    if reference:
        return None
    if "TF_CONFIG" in os.environ:
        return tf.distribute.MultiWorkerMirroredStrategy()
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
