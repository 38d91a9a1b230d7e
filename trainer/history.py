"""The History that fit returns: Keras's, plus `plot()`."""

from __future__ import annotations

import os

import keras


class History(keras.callbacks.History):
    """`keras.callbacks.History` with a `plot` method for the training curves."""

    def plot(self, path: str | os.PathLike | None = None):
        """Draws loss and metric curves, train and validation; returns the matplotlib Figure.

        Args:
          path: if given, also writes the figure there as a PNG.
        """
        from trainer.callbacks.plot import plot_history

        return plot_history(self, path)
