"""Run in a fresh process (tf.data pins glibc's threshold once per process): prints a JSON report.

Usage: python malloc_run.py [fit | fit_untuned | pin_then_raise]
"""

import ctypes
import json
import resource
import sys

from start import arguments, start

start()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.engine import malloc  # noqa: E402


def faults_reusing_a_buffer() -> int:
    """Page faults while 20 one-MiB NumPy buffers are allocated, filled and freed in turn."""
    np.ones(1 << 18, np.float32)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(20):
        np.ones(1 << 18, np.float32)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def threshold_pinned() -> bool:
    """Whether a freed 1 MiB block is mmap'ed again when asked for twice.

    glibc's dynamic threshold rises to the size of a freed mmap'ed block, so
    the second request comes from the heap unless the threshold is fixed below
    it. Valid only while the heap has less than 1 MiB free (a small, fresh
    process); a mmap'ed chunk has bit 0x2 set in its size field.
    """
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(libc.malloc(1 << 20))
    block = libc.malloc(1 << 20)
    try:
        return bool(ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value & 0x2)
    finally:
        libc.free(block)


def read_a_distributed_iterator(dataset) -> None:
    """What the trainer does with a dataset, without the trainer: a distributed iterator read in a tf.function."""
    iterator = iter(tf.distribute.OneDeviceStrategy("/cpu:0").experimental_distribute_dataset(dataset.batch(8)))
    tf.function(lambda it: it.get_next_as_optional().has_value())(iterator)


def main(mode: str) -> None:
    report = {"before": {"pinned": threshold_pinned(), "faults": faults_reusing_a_buffer()}}
    if mode == "pin_then_raise":
        report["pin_then_raise"] = malloc.pin_then_raise()
        report["after_pin_then_raise"] = {"pinned": threshold_pinned(), "faults": faults_reusing_a_buffer()}
    x, y = np.random.rand(64, 4).astype("float32"), np.random.randint(0, 2, 64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    read_a_distributed_iterator(dataset)
    report["after_tf_data"] = {"pinned": threshold_pinned(), "faults": faults_reusing_a_buffer()}
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    trainer = Trainer(strategy="one_device", per_replica_batch_size=8, verbose=0, tune_malloc=mode != "fit_untuned")
    trainer.fit(model, dataset, epochs=1)
    report["plan_process"] = malloc.tune_process(trainer.tune_malloc)  # the plan's line; applied once, by fit
    report["after_fit"] = {"pinned": threshold_pinned(), "faults": faults_reusing_a_buffer()}
    report["raised"] = malloc.raised()
    print(json.dumps(report))


if __name__ == "__main__":
    modes = ["fit", "fit_untuned", "pin_then_raise"]
    sys.exit(main(arguments(__doc__, options=(("mode", {"nargs": "?", "default": "fit", "choices": modes}),)).mode))
