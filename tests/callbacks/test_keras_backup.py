"""Keras's own keras.callbacks.BackupAndRestore under Trainer.fit: it resumes as it resumes model.fit."""

import keras
import numpy as np
import pytest

from conftest import mirrored, tiny_data, tiny_model
from trainer import Trainer

pytestmark = pytest.mark.slow  # whole trainings, twice: not in the everyday tier


class Crash(Exception):
    pass


class CrashAt(keras.callbacks.Callback):
    """Stands for a crash at the start of `epoch`, after the backup of the epoch before."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise Crash()


def _crash_then_resume(fit, backup_dir):
    x, y, w = tiny_data()
    model = tiny_model()
    with pytest.raises(Crash):
        fit(model, x, y, callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir)), CrashAt(2)])
    again = tiny_model(seed=1)  # a new process's model: the backup's weights replace its own
    history = fit(again, x, y, callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir))])
    return history, again.get_weights()


@pytest.mark.parametrize("replicas", [1, 2])
def test_keras_backup_and_restore_resumes_as_under_model_fit(tmp_path, replicas):
    reference, reference_weights = _crash_then_resume(
        lambda model, x, y, callbacks: model.fit(x, y, batch_size=32, epochs=4, shuffle=False, verbose=0,
                                                 callbacks=callbacks), tmp_path / "keras")
    trainer = Trainer(strategy="default" if replicas == 1 else mirrored(2), batch_size=32, verbose=0)
    history, weights = _crash_then_resume(
        lambda model, x, y, callbacks: trainer.fit(model, x, y, epochs=4, shuffle=False, callbacks=callbacks),
        tmp_path / "trainer")
    assert history.epoch == reference.epoch == [2, 3]
    assert sorted(history.history) == sorted(reference.history)
    for key, values in reference.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)
    for a, b in zip(weights, reference_weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)



class Interrupting(keras.callbacks.Callback):
    """BackupAndRestore's docstring: `raise RuntimeError('Interrupting!')` at the start of epoch 4."""

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 4:
            raise RuntimeError("Interrupting!")


@pytest.mark.parametrize("replicas", [1, 2])
def test_the_backup_docstrings_script_resumes_as_under_model_fit(tmp_path, replicas):
    """keras-team/keras#20712's script: a Sequential built without an Input, batch_size=1, and targets of
    shape (5,) against outputs of (5, 10), which broadcast at one row: the model was built on a batch of 2,
    where they do not, so the first fit failed before its first epoch and nothing was backed up. Its inputs
    are scaled here so that SGD stays finite (at their size, Keras's own run ends in NaN)."""
    x, y = np.arange(100).reshape(5, 20) / 100.0, np.zeros(5)

    def model():
        keras.utils.set_random_seed(0)
        built = keras.models.Sequential([keras.layers.Dense(10)])
        built.compile(keras.optimizers.SGD(), loss="mse")
        built.build(input_shape=(None, 20))
        return built

    trainer = Trainer(strategy=mirrored(replicas), verbose=0)
    interrupted, backup = model(), keras.callbacks.BackupAndRestore(backup_dir=str(tmp_path / "backup"))
    with pytest.raises(RuntimeError, match="Interrupting!"):
        trainer.fit(interrupted, x, y, epochs=10, batch_size=1, callbacks=[backup, Interrupting()], verbose=0)
    history = trainer.fit(interrupted, x, y, epochs=10, batch_size=1, callbacks=[backup], verbose=0)
    assert history.epoch == [4, 5, 6, 7, 8, 9]  # "Only 6 more epochs are run"
    uninterrupted = model()  # the trainer shuffles from its seed and the epoch: a resumed run reads the same
    expected = trainer.fit(uninterrupted, x, y, epochs=10, batch_size=1, verbose=0)
    np.testing.assert_allclose(history.history["loss"], expected.history["loss"][4:], rtol=1e-6)
    for got, want in zip(interrupted.get_weights(), uninterrupted.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # and unshuffled, the trainer's run is model.fit's
    reference, unshuffled = model(), model()
    keras_history = reference.fit(x, y, epochs=10, batch_size=1, verbose=0, shuffle=False)
    ours = trainer.fit(unshuffled, x, y, epochs=10, batch_size=1, verbose=0, shuffle=False)
    np.testing.assert_allclose(ours.history["loss"], keras_history.history["loss"], rtol=1e-5)
    for got, want in zip(unshuffled.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
