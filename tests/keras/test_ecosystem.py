"""Tools built on model.fit, with the real packages, nothing mocked (the 'ecosystem' extra).

- MLflow's autologging patches keras.Model.fit; Trainer.fit calls the model's
  own fit, so the patch runs and logs the run (params, every epoch's metrics).
- MLflow's and W&B's Keras callbacks have no chief guard; in ChiefOnly they log
  once, from the chief, on 2 workers.
- KerasTuner calls model.fit in each trial: inside Trainer.distribute() every
  trial trains on the trainer; a HyperModel.fit override can call trainer.fit.
- Ray Train's TensorflowTrainer sets TF_CONFIG for each worker: a loop calling
  Trainer(strategy="auto").fit trains as 2 synchronous workers.
"""

import contextlib
import tempfile

import keras
import numpy as np
import pytest

from conftest import mirrored, run_python, run_script, SCRIPTS, tiny_data, tiny_model
from trainer import Trainer

SCRIPT = SCRIPTS / "ecosystem_run.py"


def _needs(module):
    return pytest.importorskip(module, reason=f"{module} is in the 'ecosystem' extra: "
                               "pip install -e '.[test,ecosystem]'")


@pytest.mark.slow
@pytest.mark.parametrize("flavor", ["keras", "tensorflow"])
def test_mlflow_autologging_logs_a_trainer_fit(tmp_path, flavor):
    _needs("mlflow")
    result = run_python(SCRIPT, "autolog", flavor, str(tmp_path))
    assert result["runs"] == 1
    for key, values in result["history"].items():  # every epoch of every metric, as fit reported it
        np.testing.assert_allclose(result["logged"][key], values, rtol=1e-6, err_msg=key)
    # fit's arguments as the model's own fit received them: the Trainer's global batch, 32 per replica x 2
    assert {k: result["params"][k] for k in ("epochs", "validation_split", "batch_size")} == {
        "epochs": "3", "validation_split": "0.2", "batch_size": "64"}


@pytest.mark.slow
def test_mlflow_and_wandb_callbacks_log_once_from_the_chief(tmp_path):
    _needs("mlflow"), _needs("wandb")
    proc = run_script(SCRIPT, "trackers", tmp_path, launch=("--workers", 2), env={"WANDB_SILENT": "true"})
    import json

    chief, other = (json.loads((tmp_path / f"worker{i}.json").read_text()) for i in (0, 1))
    assert chief["is_chief"] and not other["is_chief"]
    assert "epoch/loss" in chief["wandb_keys"] and other["wandb_keys"] == []
    assert '"mlflow_runs": [3]' in proc.stdout  # one MLflow run, with the loss of each of the 3 epochs


def _hypermodel(hp):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(hp.Int("units", 4, 12, step=4), activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(hp.Choice("lr", [0.05, 0.1])),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


_SEEN = []  # KerasTuner deep-copies the callbacks of each trial: what they record goes here


class _Replicas(keras.callbacks.Callback):
    """Records the replicas of each fit the trainer ran (only the trainer hands a TrainContext over)."""

    def set_trainer_context(self, context):
        _SEEN.append(context.plan.num_replicas)


def _search(hypermodel, trainer=None):
    """A two-trial search; returns [(the trial's hyperparameters, its score)] and the replicas the trainer saw."""
    keras_tuner = _needs("keras_tuner")
    x, y, _ = tiny_data()
    _SEEN.clear()
    tuner = keras_tuner.RandomSearch(hypermodel, objective="val_loss", max_trials=2, seed=0,
                                     directory=tempfile.mkdtemp(), project_name="p")
    with trainer.distribute() if trainer is not None else contextlib.nullcontext():
        tuner.search(x, y, epochs=2, batch_size=16, validation_split=0.25, shuffle=False, callbacks=[_Replicas()],
                     verbose=0)
    return [(t.hyperparameters, t.score) for t in tuner.oracle.trials.values()], list(_SEEN)


def _assert_model_fits_scores(trials):
    """Each trial's score is what model.fit on one device gives for its hyperparameters (the best val_loss)."""
    x, y, _ = tiny_data()
    assert len(trials) == 2
    for hp, score in trials:
        history = _hypermodel(hp).fit(x, y, epochs=2, batch_size=16, validation_split=0.25, shuffle=False, verbose=0)
        np.testing.assert_allclose(score, min(history.history["val_loss"]), rtol=1e-5)


def test_a_kerastuner_search_runs_each_trial_on_the_trainer():
    trials, seen = _search(_hypermodel, Trainer(strategy=mirrored(2), lr_scaling=None, verbose=0))
    assert seen == [2, 2]  # both trials, on 2 replicas
    _assert_model_fits_scores(trials)
    assert _search(_hypermodel)[1] == []  # outside the block: Keras's own fit


def test_a_hypermodel_fit_override_calls_trainer_fit():
    keras_tuner = _needs("keras_tuner")
    trainer = Trainer(strategy=mirrored(2), lr_scaling=None, verbose=0)

    class OnTrainer(keras_tuner.HyperModel):
        def build(self, hp):
            return _hypermodel(hp)

        def fit(self, hp, model, *args, **kwargs):
            return trainer.fit(model, *args, **kwargs)

    trials, seen = _search(OnTrainer())
    assert seen == [2, 2]
    _assert_model_fits_scores(trials)


@pytest.mark.slow
def test_ray_trains_a_trainer_loop_as_two_synchronous_workers(tmp_path):
    _needs("ray.train")
    workers = run_python(SCRIPT, "ray", str(tmp_path), timeout=600)["workers"]
    x, y, _ = tiny_data(1003)
    model = tiny_model()
    history = Trainer(strategy="default", batch_size=64, lr_scaling=None, verbose=0).fit(model, x, y, epochs=2)
    for worker in workers:
        assert worker["num_workers"] == 2
        for key, values in history.history.items():
            np.testing.assert_allclose(worker["history"][key], values, rtol=1e-5, err_msg=key)
        np.testing.assert_allclose(worker["weights"], sum(np.sum(v ** 2) for v in model.get_weights()), rtol=1e-5)
