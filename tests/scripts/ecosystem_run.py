"""Tools built on model.fit, run with the real packages (tests/keras/test_ecosystem.py).

Usage:
  ecosystem_run.py autolog FLAVOR OUT   MLflow's autologging (mlflow.keras or mlflow.tensorflow) of a Trainer.fit
                                        on 2 CPU replicas, into OUT/mlflow.db (SQLite)
  ecosystem_run.py trackers OUT         under trainer-launch: MLflow's and W&B's (offline) Keras callbacks,
                                        wrapped in ChiefOnly, on each worker
  ecosystem_run.py ray OUT              Ray Train's TensorflowTrainer: a loop that calls
                                        Trainer(strategy="auto").fit as 2 workers on a local Ray
Prints one JSON line.
"""

import json
import os
import sys
import tempfile

from start import HELPERS, arguments, start

args = arguments(__doc__, ("mode", str), ("words", str, "+"))  # autolog FLAVOR OUT, trackers OUT, ray OUT
mode, out = args.mode, os.path.abspath(args.words[-1])
start()
os.chdir(out)  # what the tools write beside their stores (MLflow's artifacts under ./mlruns) stays in OUT
EPOCHS = 3


def autolog(flavor: str) -> dict:
    start(cpus=2)
    import mlflow

    from tiny import tiny_data, tiny_model
    from trainer import Trainer

    mlflow.set_tracking_uri(f"sqlite:///{out}/mlflow.db")
    getattr(mlflow, flavor).autolog(log_models=False)
    x, y, _ = tiny_data()
    history = Trainer(strategy="mirrored", verbose=0).fit(tiny_model(), x, y, epochs=EPOCHS, validation_split=0.2)
    run = mlflow.last_active_run()
    client = mlflow.MlflowClient()
    logged = {key: [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]
              for key in history.history}
    return {"history": history.history, "logged": logged, "params": run.data.params,
            "runs": len(client.search_runs([run.info.experiment_id]))}


def trackers() -> dict:
    from trainer import Trainer, cluster_info

    trainer = Trainer(strategy="multi_worker", batch_size=64, verbose=0)
    import mlflow
    import wandb
    from wandb.integration.keras import WandbMetricsLogger

    from tiny import tiny_data, tiny_model
    from trainer.callbacks import ChiefOnly

    info = cluster_info()
    mlflow.set_tracking_uri(f"sqlite:///{out}/mlflow.db")
    run = wandb.init(mode="offline", dir=tempfile.mkdtemp(dir=out), project="trainer-test")
    x, y, _ = tiny_data(301)
    callbacks = [ChiefOnly(mlflow.keras.MlflowCallback()), ChiefOnly(WandbMetricsLogger())]
    trainer.fit(tiny_model(), x, y, epochs=EPOCHS, callbacks=callbacks)
    logged = sorted(key for key in run.summary.keys() if key.startswith("epoch/"))
    run.finish()
    mlflow.end_run()
    result = {"task": info.task_id, "is_chief": info.is_chief, "wandb_keys": logged}
    with open(os.path.join(out, f"worker{info.task_id}.json"), "w") as f:
        json.dump(result, f)
    if info.is_chief:
        client = mlflow.MlflowClient()
        runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
        result["mlflow_runs"] = [len(client.get_metric_history(r.info.run_id, "loss")) for r in runs]
    return result


def ray() -> dict:
    import ray as ray_lib
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    def loop(config):
        sys.path.insert(0, config["helpers"])
        from trainer import Trainer, cluster_info

        trainer = Trainer(strategy="auto", batch_size=64, lr_scaling=None, verbose=0)  # before TensorFlow runs
        import numpy as np

        from tiny import tiny_data, tiny_model

        x, y, w = tiny_data(1003)
        model = tiny_model()
        history = trainer.fit(model, x, y, epochs=2)
        info = cluster_info()
        with open(os.path.join(config["out"], f"ray{info.task_id}.json"), "w") as f:
            json.dump({"history": history.history, "num_workers": info.num_workers,
                       "weights": float(sum(np.sum(v ** 2) for v in model.get_weights()))}, f)

    ray_lib.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        TensorflowTrainer(loop, train_loop_config={"helpers": str(HELPERS), "out": out},
                          scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                          run_config=RunConfig(storage_path=tempfile.mkdtemp(dir=out))).fit()
    finally:
        ray_lib.shutdown()
    results = []
    for task in (0, 1):
        with open(os.path.join(out, f"ray{task}.json")) as f:
            results.append(json.load(f))
    return {"workers": results}


print(json.dumps(autolog(args.words[0]) if mode == "autolog" else trackers() if mode == "trackers" else ray()))
