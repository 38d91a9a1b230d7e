"""Package hygiene: the user's process left as found (random generators, optimizer objects), and
imports that a user's own `callbacks.py` cannot shadow."""

import random
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import LearningRateSeen, mirrored, run_code, tiny_data, tiny_model
from trainer import Trainer


def _global_random_state():
    """Python's and NumPy's global generators, and Keras's global seed generator (object and state)."""
    generator = keras.src.random.seed_generator.global_seed_generator()  # made on first use, from `random`
    python, numpy_state = random.getstate(), np.random.get_state()
    return (python, (numpy_state[0], numpy_state[1].tobytes(), *numpy_state[2:]),
            id(generator), generator.state.numpy().tobytes())


def _builder():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dropout(0.1), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["none", "mirrored2"])
@pytest.mark.parametrize("form", ["builder", "model", "dataset"])
def test_fit_evaluate_predict_leave_the_global_random_generators_alone(strategy, form):
    x, y, _ = tiny_data(64)
    trainer = Trainer(strategy=mirrored(2) if strategy == "mirrored2" else None, batch_size=16, verbose=0)
    random.seed(123)
    np.random.seed(123)
    model = _builder if form == "builder" else _builder()  # "model" is built outside the strategy's scope
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16) if form == "dataset" else (x, y)
    before = _global_random_state()
    history = trainer.fit(model, data, epochs=2)
    assert _global_random_state() == before, "fit"
    trainer.evaluate(history.model, data)
    assert _global_random_state() == before, "evaluate"
    trainer.predict(history.model, x)
    assert _global_random_state() == before, "predict"


def test_a_builder_is_seeded_by_the_trainer_and_reproducible():
    x, y, _ = tiny_data(64)
    weights = []
    for python_seed in (1, 2):  # the user's own global state differs; the trainer's seed decides
        random.seed(python_seed)
        np.random.seed(python_seed)
        history = Trainer(seed=7, batch_size=16, verbose=0).fit(_builder, (x, y), epochs=0)
        weights.append(history.model.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_array_equal(a, b)


def test_seed_none_leaves_a_builder_unseeded():
    x, y, _ = tiny_data(64)
    random.seed(5)
    first = Trainer(seed=None, batch_size=16, verbose=0).fit(_builder, (x, y), epochs=0).model.get_weights()
    random.seed(5)
    again = Trainer(seed=None, batch_size=16, verbose=0).fit(_builder, (x, y), epochs=0).model.get_weights()
    other = Trainer(seed=None, batch_size=16, verbose=0).fit(_builder, (x, y), epochs=0).model.get_weights()
    np.testing.assert_array_equal(first[0], again[0])  # drawn from the user's global state, as Keras draws
    assert not np.array_equal(first[0], other[0])


def test_seed_none_is_refused_where_workers_must_shuffle_alike(monkeypatch):
    from trainer import stages

    x, y, _ = tiny_data(64)
    monkeypatch.setattr(stages, "workers",
                        lambda strategy, training=True: {"num_workers": 2, "parameter_server": False})
    model = tiny_model()
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=r"Trainer\(seed=None\) with shuffle=True on several workers"):
        Trainer(seed=None, verbose=0).fit(model, x, y)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


DECOY = "NAME = 'the user\\'s own callbacks.py'\n"


@pytest.mark.slow
def test_a_callbacks_py_in_the_working_directory_leaves_fit_working(tmp_path):
    (tmp_path / "callbacks.py").write_text(DECOY)
    code = textwrap.dedent("""
        import numpy as np, keras
        from callbacks import NAME  # the user's own module
        from trainer import Trainer
        from trainer.callbacks import CSVLogger
        x, y = np.random.default_rng(0).normal(size=(64, 8)), np.arange(64) % 3
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = Trainer(batch_size=16).fit(model, x, y, epochs=2, callbacks=[CSVLogger("log.csv")])
        print(NAME, len(history.history["loss"]))
    """)
    proc = run_code(code, cwd=tmp_path, timeout=120)
    assert "the user's own callbacks.py 2" in proc.stdout
    assert "Training plan" in proc.stdout  # the default ProgressBar and NanGuard came from trainer.callbacks
    assert (tmp_path / "log.csv").read_text().count("\n") == 3


def test_the_repository_callbacks_folder_refuses_a_second_name():
    from conftest import TESTS

    proc = run_code("import callbacks", cwd=TESTS.parent, timeout=60, check=False)
    assert proc.returncode != 0
    assert "`from trainer.callbacks import ModelCheckpoint, ...`" in proc.stderr


def test_python_started_in_a_clone_finds_trainer_callbacks_without_an_editable_install():
    # After `pip install .` (no editable finder), Python started in the clone's root imports the clone's trainer/,
    # which has no callbacks/ folder: the README's quickstart pasted there failed in fit.
    from conftest import TESTS

    code = ("import sys, importlib.util; sys.meta_path[:] = [f for f in sys.meta_path if 'Editable' not in "
            "getattr(f, '__name__', '')]; import trainer; print(importlib.util.find_spec('trainer.callbacks').origin)")
    proc = run_code(code, cwd=TESTS.parent, timeout=60)
    assert proc.stdout.strip() == str(TESTS.parent / "callbacks" / "__init__.py")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["none", "mirrored2"])
def test_the_models_optimizer_is_untouched_where_nothing_is_scaled(strategy):
    x, y, _ = tiny_data(64)
    strategy = mirrored(2) if strategy == "mirrored2" else tf.distribute.get_strategy()
    with strategy.scope():
        model = tiny_model(lr=0.05)
    optimizer = model.optimizer
    trainer = Trainer(strategy=strategy, batch_size=16, lr_scaling=None, verbose=0)
    trainer.fit(model, x, y, epochs=2)
    assert model.optimizer is optimizer
    assert float(optimizer.learning_rate.numpy()) == pytest.approx(0.05)
    assert int(optimizer.iterations.numpy()) == 8  # it trained: 2 epochs of 4 steps
    trainer.fit(model, x, y, epochs=1)
    assert model.optimizer is optimizer and int(optimizer.iterations.numpy()) == 12


@pytest.mark.slow
def test_a_model_fitted_by_two_trainers_is_scaled_once_by_each():
    # The learning rate is scaled only during a fit: between fits the optimizer holds the rate as tuned.
    x, y, _ = tiny_data(64)
    strategy = mirrored(2)
    with strategy.scope():
        model = tiny_model(lr=0.05)
    first, second = (Trainer(strategy=strategy, per_replica_batch_size=16, lr_scaling="linear", verbose=0)
                     for _ in range(2))
    during = LearningRateSeen()
    for trainer in (first, first, second):
        trainer.fit(model, x, y, epochs=1, callbacks=[during])
        assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.05)
    assert during.seen == [pytest.approx(0.1)] * 3  # 2 replicas, linear: once per fit, never twice
