"""Callbacks for Trainer.fit that are safe on every strategy.

Each is a `keras.callbacks.Callback`. Only the chief writes files or draws;
under multi-worker training the other workers take part in saves but write to
temporary directories, which are deleted.

Import them as `trainer.callbacks` (setup.cfg installs this folder under that
name). As a top-level `callbacks` they would clash with a user's own
callbacks.py, which comes first on sys.path, and with other distributions of
that name.
"""

if __name__ != "trainer.callbacks":  # the repository's root on sys.path: a second copy of every class
    raise ImportError(
        f"The trainer's callbacks are imported as `trainer.callbacks`, not `{__name__}`. "
        "Write `from trainer.callbacks import ModelCheckpoint, ...` (after `pip install -e .` in the repository)."
    )

from .backup import BackupAndRestore
from .checkpoint import ModelCheckpoint
from .chief_only import ChiefOnly
from .csv_logger import CSVLogger
from .json_logger import JSONLogger
from .nan_guard import NanGuard
from .plot import PlotHistory, plot_history
from .progress import ProgressBar
from .tensorboard import TensorBoard

__all__ = [
    "BackupAndRestore",
    "CSVLogger",
    "ChiefOnly",
    "JSONLogger",
    "ModelCheckpoint",
    "NanGuard",
    "PlotHistory",
    "ProgressBar",
    "TensorBoard",
    "plot_history",
]
