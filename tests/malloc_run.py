"""Run in a fresh process (tf.data pins glibc's threshold once per process): prints a JSON report."""

import json
import resource
import sys

import numpy as np
import tensorflow as tf

from trainer import Trainer, malloc


def faults_reusing_a_buffer() -> int:
    """Page faults while 20 one-MiB NumPy buffers are allocated, filled and freed in turn."""
    np.ones(1 << 18, np.float32)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        np.ones(1 << 18, np.float32)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def main() -> None:
    report = {"before": {"pinned": malloc.threshold_pinned(), "faults": faults_reusing_a_buffer()}}
    # What the trainer does with a dataset, without the trainer: a distributed iterator read in a tf.function.
    x, y = np.random.rand(64, 4).astype("float32"), np.random.randint(0, 2, 64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    iterator = iter(tf.distribute.OneDeviceStrategy("/cpu:0").experimental_distribute_dataset(dataset.batch(8)))
    tf.function(lambda it: it.get_next_as_optional().has_value())(iterator)
    report["after_tf_data"] = {"pinned": malloc.threshold_pinned(), "faults": faults_reusing_a_buffer()}
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    Trainer(strategy="one_device", per_replica_batch_size=8, verbose=0).fit(model, dataset, epochs=1)
    report["after_fit"] = {"pinned": malloc.threshold_pinned(), "faults": faults_reusing_a_buffer()}
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
