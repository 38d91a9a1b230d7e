"""More forms of TensorFlow's "Distributed input" guide, trained in one device layout; saves what each task got.

Usage: python guide_input_run.py DATA_DIR OUT_DIR [--replicas N] [--reference] [--write]

`--write`: writes 8 TFRecord files of 12 examples to DATA_DIR and exits. `--reference`: `model.fit` on one device
on the files read whole, and on tf.data service datasets (an in-process dispatcher and worker).
Otherwise, in a strategy of N CPU replicas (a MultiWorkerMirroredStrategy under TF_CONFIG), through
`Trainer(strategy=strategy).fit` and through `model.fit` inside `Trainer.distribute()`: the files with each
`auto_shard_policy` (OFF, DATA, FILE), and tf.data service datasets (`parallel_epochs` and `distributed_epoch`,
a job of each worker's own from a service in each process); on several workers, also a job they share by its
name, from task 0's dispatcher on --shared-service-port, and the plan's sharding reasons for the two jobs. Each
task writes OUT_DIR/<task>.json: per form and route, the history (with the sum of the targets trained on), the
optimizer's steps and the final weights.
"""

import json
import os

import numpy as np
import tensorflow as tf

from start import REFERENCE, REPLICAS, WRITE, arguments, start, user_strategy

args = arguments(__doc__, ("data", str), ("out", str, "?"), options=(REPLICAS, REFERENCE, WRITE,
    ("--shared-service-port", {"type": int, "help": "on several workers: task 0's dispatcher of a shared job"})))
FILES, PER_FILE, BATCH = 8, 12, 24
if args.write:
    rng = np.random.default_rng(0)
    for f in range(FILES):
        with tf.io.TFRecordWriter(os.path.join(args.data, f"part-{f}.tfrecord")) as writer:
            for _ in range(PER_FILE):
                x = rng.normal(size=4).astype("float32")
                feature = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                           "y": tf.train.Feature(float_list=tf.train.FloatList(value=[x[0] - x[1]]))}
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    raise SystemExit(0)
start(cpus=args.replicas if args.replicas > 1 else 0)
workers = "TF_CONFIG" in os.environ
strategy = user_strategy(args.replicas, reference=args.reference)

import keras  # noqa: E402

from trainer import Trainer, cluster_info  # noqa: E402
from trainer.data.dataset_inputs import shard_policy  # noqa: E402

SPEC = {"x": tf.io.FixedLenFeature([4], tf.float32), "y": tf.io.FixedLenFeature([1], tf.float32)}
files = sorted(os.path.join(args.data, name) for name in os.listdir(args.data) if name.endswith(".tfrecord"))


def parse(record):
    example = tf.io.parse_single_example(record, SPEC)
    return example["x"], example["y"]


def from_files(policy=None) -> tf.data.Dataset:
    dataset = tf.data.TFRecordDataset(files).map(parse).batch(BATCH)
    if policy is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
        dataset = dataset.with_options(options)
    return dataset


def from_service(target, mode="parallel_epochs", job_name=None) -> tf.data.Dataset:
    return from_files().apply(tf.data.experimental.service.distribute(mode, target, job_name=job_name))


class TargetSum(keras.metrics.Metric):
    """The sum of the targets trained on in an epoch: which examples an epoch read, and how often."""

    def __init__(self, name="target_sum", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.total.assign_add(keras.ops.sum(keras.ops.cast(y_true, "float32")))

    def result(self):
        return self.total


def model() -> keras.Model:
    keras.utils.set_random_seed(1)
    built = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    built.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae", TargetSum()])
    return built


def run(fit) -> dict:
    fitted = model()
    history = fit(fitted)
    return {"history": history.history, "iterations": int(fitted.optimizer.iterations.numpy()),
            "weights": np.concatenate([w.ravel() for w in fitted.get_weights()]).tolist()}


dispatcher = tf.data.experimental.service.DispatchServer()  # each process's own service, with one worker
service = dispatcher.target
service_worker = tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(
    dispatcher_address=dispatcher.target.split("://")[1]))
SERVICE = {"service": lambda: from_service(service),
           "service_distributed": lambda: from_service(service, "distributed_epoch")}
results = {}
if args.reference:
    results["files"] = run(lambda m: m.fit(from_files(), epochs=3, verbose=0))
    for name, form in SERVICE.items():
        results[name] = run(lambda m: m.fit(form(), epochs=3, verbose=0))
else:
    trainer = Trainer(strategy=strategy, verbose=0)
    forms = {f"files_{policy}": (lambda policy=policy: from_files(policy)) for policy in ("OFF", "DATA", "FILE")}
    for name, form in {**forms, **SERVICE}.items():
        results[f"{name}/trainer"] = run(lambda m: trainer.fit(m, form(), epochs=3))

        def in_block(m):
            with trainer.distribute():
                return m.fit(form(), epochs=3, verbose=0)

        results[f"{name}/block"] = run(in_block)
    if workers:  # a job the workers share, by its name, on task 0's dispatcher: it hands each other batches
        address = f"localhost:{args.shared_service_port}"
        if cluster_info().task_id == 0:
            shared_dispatcher = tf.data.experimental.service.DispatchServer(
                tf.data.experimental.service.DispatcherConfig(port=args.shared_service_port))
        shared_worker = tf.data.experimental.service.WorkerServer(
            tf.data.experimental.service.WorkerConfig(dispatcher_address=address))

        def shared(route):
            return from_service(f"grpc://{address}", "distributed_epoch", job_name=f"shared_{route}")

        results["shared_job/trainer"] = run(lambda m: trainer.fit(m, shared("trainer"), epochs=3))

        def shared_in_block(m):
            with trainer.distribute():
                return m.fit(shared("block"), epochs=3, verbose=0)

        results["shared_job/block"] = run(shared_in_block)
        results["sharding"] = {name: shard_policy(form(), 2)[1]
                               for name, form in (("own job", SERVICE["service"]), ("shared job", lambda: shared("x")))}
info = cluster_info()
with open(os.path.join(args.out, f"{info.task_type or 'single'}{info.task_id}.json"), "w") as f:
    json.dump(results, f)
print(json.dumps(sorted(results)))
