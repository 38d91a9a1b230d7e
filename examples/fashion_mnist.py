"""Fashion-MNIST through the trainer: the tf.distribute custom-training tutorial, as users run it.

    python examples/fashion_mnist.py                       # real data (downloads it when online)
    python examples/fashion_mnist.py --data-dir ~/data/fashion   # the four standard IDX .gz files
    sudo apt-get install dataset-fashion-mnist             # Debian's copy of those files, found by default
    python examples/fashion_mnist.py --synthetic 2000 --epochs 1 # offline smoke run
    python examples/fashion_mnist.py --cpu-replicas 2 --strategy mirrored   # 2 replicas on one CPU
    python examples/fashion_mnist.py --mixed-precision mixed_bfloat16     # 16-bit layers (CPUs with AMX or AVX512_BF16)
    trainer-launch --workers 2 examples/fashion_mnist.py --synthetic 2000  # 2 local workers

It prints the plan, shows a progress bar, writes logs, the best and last
checkpoints and a PNG of the curves under --out, reports test accuracy, then
restores the last checkpoint into a model built without any strategy and shows
that its test accuracy matches.

With TRAINER_BACKUP_DIR set (the Slurm batch file and the Kubernetes manifests
set it), fit backs up under that folder (fit-1/) at each epoch's end and on
SIGTERM, and the same command run again resumes from it (docs/howto/resume.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the example's `idx` reader
DATA_HOST = ("storage.googleapis.com", 443)  # where keras.datasets.fashion_mnist downloads from
SYSTEM_DATA_DIR = "/usr/share/datasets/fashion-mnist"  # Debian's dataset-fashion-mnist: the official files
CLASSES = 10
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


def build_model(learning_rate: float = 1e-3):
    """The tutorial's CNN, compiled with Adam."""
    import keras

    model = keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def synthetic_images(n: int, seed: int = 0, split: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` uint8 28x28 images whose class is learnable: a per-class template (from `seed`) plus noise.

    Different `split`s draw different images of the same classes.
    """
    templates = np.random.default_rng(seed).uniform(0, 1, size=(CLASSES, 28, 28)) > 0.6
    rng = np.random.default_rng([seed, split + 1])
    labels = rng.integers(0, CLASSES, size=n).astype(np.uint8)
    images = 0.6 * templates[labels] + 0.4 * rng.uniform(0, 1, size=(n, 28, 28))
    return (images * 255).astype(np.uint8), labels


def _reachable(host: tuple[str, int], timeout: float = 3.0) -> bool:
    """Whether `host` accepts a connection within `timeout` seconds (DNS included)."""
    import socket

    result = []

    def connect():
        try:
            socket.create_connection(host, timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(result and result[0])


def _has_the_files(directory: str) -> bool:
    from idx import FILES

    return all(os.path.exists(os.path.join(directory, name)) for name in FILES.values())


def _keras_cache() -> str:
    return os.path.join(os.path.expanduser(os.environ.get("KERAS_HOME", "~/.keras")), "datasets", "fashion-mnist")


def real_data_available() -> bool:
    """Whether `load_raw(None, None, ...)` will find the real data: cached, installed by apt, or downloadable."""
    return _has_the_files(_keras_cache()) or _has_the_files(SYSTEM_DATA_DIR) or _reachable(DATA_HOST)


def load_raw(data_dir: str | None, synthetic: int | None, seed: int):
    """uint8 ((x_train, y_train), (x_test, y_test)) from IDX files, generated images or Keras.

    With neither `data_dir` nor `synthetic`: Keras's cache, else the files of
    Debian's dataset-fashion-mnist package, else Keras's download.
    """
    from idx import load_dataset

    if synthetic is not None:
        train = synthetic_images(synthetic, seed, split=0)
        test = synthetic_images(max(synthetic // 5, 10), seed, split=1)
        return train, test
    if data_dir is not None:
        return load_dataset(data_dir)
    if not _has_the_files(_keras_cache()):
        if _has_the_files(SYSTEM_DATA_DIR):
            print(f"Fashion-MNIST from {SYSTEM_DATA_DIR}")
            return load_dataset(SYSTEM_DATA_DIR)
        if not _reachable(DATA_HOST):
            raise SystemExit(
                "Fashion-MNIST is not cached and its download host can't be reached (offline?). "
                "Pass --data-dir DIR with the four IDX files (train-images-idx3-ubyte.gz, ...), install "
                f"them with `apt-get install dataset-fashion-mnist` (Debian, Ubuntu: into {SYSTEM_DATA_DIR}), "
                "or pass --synthetic N to train on N generated images."
            )
    import keras

    return keras.datasets.fashion_mnist.load_data()


def prepare(images: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scales to [0, 1] and adds the channel axis, as the tutorial does."""
    return (images[..., None] / np.float32(255)).astype(np.float32), labels.astype(np.int64)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--strategy", default="auto", help="a trainer strategy name (default: auto)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64, help="per-replica batch size (default: 64)")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate for --batch examples")
    parser.add_argument("--lr-scaling", default="auto", choices=["auto", "linear", "sqrt", "none"])
    parser.add_argument("--steps", type=int, default=None, help="cap on steps per epoch (quick runs)")
    parser.add_argument("--out", default="runs/fashion_mnist", help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mixed-precision", choices=["mixed_float16", "mixed_bfloat16"], default=None,
                        help="16-bit layers (default: float32); "
                             "mixed_bfloat16 is faster on CPUs with AMX or AVX512_BF16")
    parser.add_argument("--cpu-replicas", type=int, default=None,
                        help="split the CPU into N logical devices, to try 'mirrored' without GPUs")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data-dir", help="directory with the four Fashion-MNIST IDX .gz files")
    source.add_argument("--synthetic", type=int, metavar="N", help="train on N generated images (offline)")
    args = parser.parse_args(argv)
    for name in ("epochs", "batch", "steps", "synthetic", "cpu_replicas"):
        value, flag = getattr(args, name), f"--{name.replace('_', '-')}"
        if value is not None and value < 1:
            parser.error(f"{flag} must be an integer >= 1. Received: {flag} {value}. Pass e.g. {flag} 2.")
    if not args.lr > 0:
        parser.error(f"--lr must be a positive number. Received: --lr {args.lr}. Pass e.g. --lr 0.001.")
    if args.data_dir is not None and not os.path.isdir(args.data_dir):
        parser.error(f"--data-dir must be an existing directory with the four Fashion-MNIST IDX .gz files. "
                     f"Received: --data-dir {args.data_dir!r}. Check the path, or pass --synthetic N to run offline.")
    _check_strategy_and_out(parser, args)
    return args


def _check_strategy_and_out(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from trainer.distribute.strategy import STRATEGY_NAMES, closest_name

    if args.strategy not in STRATEGY_NAMES:
        guess = closest_name(args.strategy)
        parser.error(f"--strategy must be one of {', '.join(STRATEGY_NAMES)}. Received: --strategy "
                     f"{args.strategy!r}. " + (f"Did you mean --strategy {guess}?" if guess else "Pass one of those."))
    from trainer.callbacks._paths import checked_path

    try:
        checked_path(args.out, arg="--out", owner="the example's outputs", is_dir=True)
    except (TypeError, ValueError) as err:
        parser.error(str(err))


def main(argv=None) -> dict:
    from trainer.quiet import startup_notices_hidden

    # TensorFlow's C++ start-up notices (no CUDA driver, CPU features, oneDNN) stay off the screen while it
    # loads (the argument checks import it) and finds its devices; a TF_CPP_MIN_LOG_LEVEL of yours shows
    # TensorFlow's logs as you set them.
    with startup_notices_hidden():
        args = parse_args(argv)
        import tensorflow as tf

        if args.cpu_replicas:
            tf.config.set_logical_device_configuration(
                tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * args.cpu_replicas)
        import keras

        from trainer.callbacks import CSVLogger, JSONLogger, ModelCheckpoint, PlotHistory
        from trainer import Trainer, cluster_info

        # First: a multi-worker strategy must exist before TensorFlow runs anything.
        trainer = Trainer(strategy=args.strategy, per_replica_batch_size=args.batch, seed=args.seed,
                          lr_scaling=None if args.lr_scaling == "none" else args.lr_scaling,
                          mixed_precision=args.mixed_precision)
    (x_train, y_train), (x_test, y_test) = (prepare(*split)
                                            for split in load_raw(args.data_dir, args.synthetic, args.seed))
    chief = cluster_info().is_chief
    out = args.out
    history = trainer.fit(
        lambda: build_model(args.lr), (x_train, y_train), epochs=args.epochs, steps_per_epoch=args.steps,
        validation_data=(x_test, y_test),
        callbacks=[
            ModelCheckpoint(os.path.join(out, "checkpoints"), monitor="val_accuracy", save_best_only=True),
            CSVLogger(os.path.join(out, "log.csv")),
            JSONLogger(os.path.join(out, "log.jsonl")),
            PlotHistory(os.path.join(out, "curves.png")),
        ],
    )
    test = trainer.evaluate(history.model, (x_test, y_test), return_dict=True)

    results = {"test_accuracy": test["accuracy"], "test_loss": test["loss"], "epochs": len(history.epoch)}
    if not chief:  # the checkpoint files are the chief's
        return results
    print(f"Test accuracy: {test['accuracy']:.4f} (loss {test['loss']:.4f})")
    # As the tutorial does: restore the checkpoint into a model built without any strategy.
    restored = keras.models.load_model(ModelCheckpoint.last_path(os.path.join(out, "checkpoints")))
    logits = restored.predict(x_test, batch_size=256, verbose=0)
    results["restored_test_accuracy"] = float(np.mean(np.argmax(logits, axis=1) == y_test))
    print(f"Restored without a strategy: test accuracy {results['restored_test_accuracy']:.4f}")
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
