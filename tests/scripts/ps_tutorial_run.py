"""TensorFlow's "Parameter server training" tutorial, its Model.fit section, through the trainer.

Usage: python ps_tutorial_run.py {in_process,tf_config} WORKING_DIR
  in_process: the tutorial's in-process cluster of 2 workers and 1 ps; tf_config: the cluster TF_CONFIG
  describes (under `trainer-launch --workers 2 --ps 1`): the workers and the ps task serve, the chief fits.

The tutorial's code, with the changes Keras 3 itself needs: `keras` for `tf.keras`, SGD for the legacy
optimizer, a `.keras` checkpoint path, and targets of shape (10, 1) (Keras 3's mse no longer expands (64,)
targets against (64, 10) outputs); and the one change the trainer asks for, `Trainer(strategy=strategy).fit`
for `model.fit`. Prints a JSON line: the losses, the step count, the plan's rows, and what the callbacks wrote.
"""
import argparse
import json
import multiprocessing
import os
import socket
os.environ["GRPC_FAIL_FAST"] = "use_caller"
from start import start  # noqa: E402

start()
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

from trainer import Trainer  # noqa: E402
parser = argparse.ArgumentParser()
parser.add_argument("cluster", choices=["in_process", "tf_config"])
parser.add_argument("working_dir")
args = parser.parse_args()
mode, working_dir = args.cluster, args.working_dir

def pick():  # the tutorial's portpicker.pick_unused_port
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]

def create_in_process_cluster(num_workers, num_ps):
    worker_ports = [pick() for _ in range(num_workers)]
    ps_ports = [pick() for _ in range(num_ps)]
    cluster_dict = {"worker": ["localhost:%s" % p for p in worker_ports]}
    if num_ps > 0:
        cluster_dict["ps"] = ["localhost:%s" % p for p in ps_ports]
    cluster_spec = tf.train.ClusterSpec(cluster_dict)
    worker_config = tf.compat.v1.ConfigProto()
    if multiprocessing.cpu_count() < num_workers + 1:
        worker_config.inter_op_parallelism_threads = num_workers + 1
    for i in range(num_workers):
        tf.distribute.Server(cluster_spec, job_name="worker", task_index=i, config=worker_config, protocol="grpc")
    for i in range(num_ps):
        tf.distribute.Server(cluster_spec, job_name="ps", task_index=i, protocol="grpc")
    return tf.distribute.cluster_resolver.SimpleClusterResolver(cluster_spec, rpc_layer="grpc")

NUM_WORKERS, NUM_PS = 2, 1
if mode == "in_process":
    cluster_resolver = create_in_process_cluster(NUM_WORKERS, NUM_PS)
else:
    cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if cluster_resolver.task_type in ("worker", "ps"):
        server = tf.distribute.Server(cluster_resolver.cluster_spec(), job_name=cluster_resolver.task_type,
                                      task_index=cluster_resolver.task_id,
                                      protocol=cluster_resolver.rpc_layer or "grpc", start=True)
        server.join()

variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=(256 << 10), max_shards=NUM_PS)
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=variable_partitioner)

global_batch_size = 64
x = tf.random.uniform((10, 10))
y = tf.random.uniform((10, 1))  # Keras 3: mse no longer expands (64,) against (64, 10)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10).repeat()
dataset = dataset.batch(global_batch_size)
dataset = dataset.prefetch(2)

with strategy.scope():
    model = keras.models.Sequential([keras.layers.Dense(10)])
    model.compile(keras.optimizers.SGD(), loss="mse", steps_per_execution=10)

log_dir = os.path.join(working_dir, "log")
ckpt_filepath = os.path.join(working_dir, "ckpt.keras")
backup_dir = os.path.join(working_dir, "backup")
callbacks = [
    keras.callbacks.TensorBoard(log_dir=log_dir),
    keras.callbacks.ModelCheckpoint(filepath=ckpt_filepath),
    keras.callbacks.BackupAndRestore(backup_dir=backup_dir),
]
history = Trainer(strategy=strategy).fit(model, dataset, epochs=5, steps_per_epoch=20, callbacks=callbacks)

reloaded = keras.models.load_model(ckpt_filepath)
print(json.dumps({"loss": history.history["loss"], "iterations": int(model.optimizer.iterations.numpy()),
                  "reloaded": [bool((a == b).all()) for a, b in zip(reloaded.get_weights(), model.get_weights())],
                  "tensorboard": sorted(os.listdir(log_dir)), "backup_left": os.path.exists(backup_dir)}))
