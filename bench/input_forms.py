"""Batched datasets and PyDatasets through the Trainer, against Keras's fit on the same objects.

    python bench/input_forms.py [--examples 12800] [--repeats 3] [--out FILE]

The model is the Fashion-MNIST example's CNN. The data is one batched
tf.data.Dataset (`.shuffle(n).batch(B).prefetch(AUTOTUNE)`, as the TensorFlow
tutorials build it) and one `keras.utils.PyDataset` with 2 worker threads, both
in global batches of 64 per replica. Variants, each with no strategy and with
MirroredStrategy over 2 logical CPU devices, timed epoch by epoch and
interleaved as in bench/throughput.py:

  trainer              Trainer.fit(model, dataset)
  keras_fit            keras Model.fit(dataset), jit_compile=False and
                       steps_per_execution=32 (1 under MirroredStrategy, where
                       Keras fails with more), the Trainer's own settings on CPU
  trainer_pydataset    Trainer.fit(model, pydataset)
  keras_fit_pydataset  keras Model.fit(pydataset), settings as keras_fit

Targets (issue 22): the batched dataset at >= 1.0x Keras's fit; the PyDataset
keeping pace with Keras's fit (its workers bound both).
"""

from __future__ import annotations

import statistics

import throughput

FUSED_STEPS = 32


def _pydataset(x, y, batch):
    import keras

    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=2)

        def __len__(self):
            return -(-len(x) // batch)

        def __getitem__(self, i):
            return x[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]

    return Batches()


def runners(strategy, x, y) -> dict:
    import tensorflow as tf
    import variants
    from fashion_mnist import build_model

    batch = variants.PER_REPLICA * strategy.num_replicas_in_sync
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).batch(batch).prefetch(tf.data.AUTOTUNE)
    pydataset = _pydataset(x, y, batch)

    def trainer(data):
        runner = variants.trainer(strategy, x, y)
        runner.data = data
        return runner

    def keras_fit(data):
        with strategy.scope():
            model = build_model()
            model.compile(optimizer=model.optimizer, loss=model.loss, metrics=["accuracy"], jit_compile=False,
                          steps_per_execution=FUSED_STEPS if strategy.num_replicas_in_sync == 1 else 1)

        def epoch() -> int:
            model.fit(data, epochs=1, verbose=0, shuffle=False)
            return len(x)

        return variants._Runner(epoch)

    return {"trainer": trainer(dataset), "keras_fit": keras_fit(dataset),
            "trainer_pydataset": trainer(pydataset), "keras_fit_pydataset": keras_fit(pydataset)}


def _paired(rates: dict, a: str, b: str) -> float | None:
    if a not in rates or b not in rates:
        return None
    return statistics.median(p / q for p, q in zip(rates[a], rates[b]))


def _report(layout: str, measured: dict) -> None:
    rates = measured["all_examples_per_s"]
    measured["ratios"] = {"batched_dataset": _paired(rates, "trainer", "keras_fit"),
                          "pydataset": _paired(rates, "trainer_pydataset", "keras_fit_pydataset")}
    print(f"{layout}: Trainer / Keras fit, same object: " + ", ".join(
        f"{k} {v:.3f}x" for k, v in measured["ratios"].items() if v is not None), flush=True)


def main() -> None:
    throughput.run_layouts(__doc__.split("\n")[0], runners, _report)


if __name__ == "__main__":
    main()
