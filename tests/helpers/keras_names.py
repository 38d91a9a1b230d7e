"""Keras's private classes that tests name, found in the installed Keras whatever it calls them (Keras 3.16
renamed keras/src/backend/tensorflow/trainer.py's TensorFlowTrainer to Trainer)."""

import keras


def backend_trainer() -> type:
    """Keras's TensorFlow backend trainer: the base of `keras.Model` defined in keras/src/backend/tensorflow/
    trainer.py, which holds Keras's own fit, evaluate and predict."""
    return next(cls for cls in keras.Model.__mro__ if cls.__module__ == "keras.src.backend.tensorflow.trainer")
