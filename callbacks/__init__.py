"""Callbacks for Trainer.fit that are safe on every strategy.

Each is a `keras.callbacks.Callback`. Only the chief writes files or draws;
under multi-worker training the other workers take part in saves but write to
temporary directories, which are deleted.
"""

from callbacks.backup import BackupAndRestore
from callbacks.checkpoint import ModelCheckpoint
from callbacks.csv_logger import CSVLogger
from callbacks.json_logger import JSONLogger
from callbacks.nan_guard import NanGuard
from callbacks.plot import PlotHistory, plot_history
from callbacks.progress import ProgressBar
from callbacks.tensorboard import TensorBoard

__all__ = [
    "BackupAndRestore",
    "CSVLogger",
    "JSONLogger",
    "ModelCheckpoint",
    "NanGuard",
    "PlotHistory",
    "ProgressBar",
    "TensorBoard",
    "plot_history",
]
