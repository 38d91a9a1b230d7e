"""TensorBoard: scalar summaries written with tf.summary, by the chief only."""

from __future__ import annotations

import os

import tensorflow as tf

from ._cluster import ContextAware
from ._paths import checked_frequency, checked_path


def _scalar_metadata() -> tf.compat.v1.SummaryMetadata:
    # What tf.summary.scalar would attach, built without the tensorboard package
    # (TF 2.21 does not install it, and tf.summary.scalar then fails).
    metadata = tf.compat.v1.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    return metadata


def write_scalar(tag: str, value: float, step: int) -> None:
    """Writes one scalar that TensorBoard's scalar dashboard shows, to the default writer."""
    tf.summary.write(tag, tf.constant(float(value), tf.float32), step=step, metadata=_scalar_metadata())


class TensorBoard(ContextAware):
    """Writes epoch scalars (and, if asked, every `update_freq` steps) for TensorBoard.

    Training scalars go to `log_dir/train`, validation scalars to
    `log_dir/validation` under the same tags, so TensorBoard overlays them.
    Only TensorFlow's own `tf.summary.write` is used: the tensorboard package is
    not needed to write (TensorBoard itself is needed to view).

    Args:
      log_dir: where the event files go.
      update_freq: "epoch", or a number of steps between step-level scalars.
    """

    def __init__(self, log_dir: str | os.PathLike, update_freq: int | str = "epoch"):
        super().__init__()
        self.update_freq = checked_frequency(update_freq, arg="update_freq", example=100)
        self.log_dir = checked_path(log_dir, arg="log_dir", owner="TensorBoard", is_dir=True)
        self._writers: dict[str, tf.summary.SummaryWriter] = {}
        self._global_step = 0
        self._last_logged = 0

    def _writer(self, name: str) -> tf.summary.SummaryWriter:
        if name not in self._writers:
            self._writers[name] = tf.summary.create_file_writer(os.path.join(self.log_dir, name))
        return self._writers[name]

    def on_train_begin(self, logs=None):
        self._active = self.is_chief

    def on_train_batch_end(self, batch, logs=None):
        self._global_step = int(self.model.optimizer.iterations.numpy()) if self.model.optimizer else batch + 1
        if not self._active or self.update_freq == "epoch" or not logs:
            return
        if self._global_step - self._last_logged >= self.update_freq:
            self._last_logged = self._global_step
            with self._writer("train").as_default():
                for name, value in logs.items():
                    write_scalar(f"batch_{name}", value, self._global_step)

    def on_epoch_end(self, epoch, logs=None):
        if not self._active:
            return
        train = {k: v for k, v in (logs or {}).items() if not k.startswith("val_")}
        val = {k[4:]: v for k, v in (logs or {}).items() if k.startswith("val_")}
        for name, scalars in (("train", train), ("validation", val)):
            if not scalars:
                continue
            with self._writer(name).as_default():
                for tag, value in scalars.items():
                    if isinstance(value, (int, float)):
                        write_scalar(f"epoch_{tag}", value, epoch)
            self._writer(name).flush()

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()
