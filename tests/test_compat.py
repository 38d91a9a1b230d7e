"""trainer/_compat.py: Keras's own functions are back in place after the trainer traces a step."""

import keras
import numpy as np
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from keras.src.losses import loss as loss_module
from keras.src.optimizers.base_optimizer import BaseOptimizer
import tensorflow as tf

from trainer import Trainer, _compat


def _keras_functions():
    return (loss_module.scale_loss_for_distribution, loss_module.unscale_loss_for_distribution,
            TFOptimizer._all_reduce_sum_gradients, BaseOptimizer._clip_gradients, BaseOptimizer.apply,
            tf.__internal__.distribute.interim.maybe_merge_call)


def test_the_hooks_are_installed_only_while_tracing_and_nest():
    before = _keras_functions()
    with _compat.replica_hooks():
        inside = _keras_functions()
        with _compat.replica_hooks():
            pass
        assert _keras_functions() == inside  # the inner exit leaves the outer's hooks
    assert _keras_functions() == before
    # Five are replaced while tracing; `maybe_merge_call` only inside the one cross-replica apply.
    assert sum(a is not b for a, b in zip(before, inside)) == 5


def test_fit_leaves_keras_as_it_found_it():
    before = _keras_functions()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1, clipnorm=1.0, gradient_accumulation_steps=2), loss="mse")
    x = np.ones((16, 3), "float32")
    Trainer(batch_size=4, verbose=0).fit(model, (x, x[:, :1]), epochs=1)
    assert _keras_functions() == before


def test_step_counter_counts_every_apply_with_accumulation():
    optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=3)
    variable = keras.Variable(np.zeros(2, "float32"))
    optimizer.build([variable])
    for _ in range(7):
        optimizer.apply([np.ones(2, "float32")], [variable])
    assert int(_compat.step_counter(optimizer).numpy()) == 7
    assert int(optimizer.iterations.numpy()) == 2  # Keras counts updates there
