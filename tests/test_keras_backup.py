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

