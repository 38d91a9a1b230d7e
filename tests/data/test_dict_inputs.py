"""A dict of data for a model's inputs: taken as Keras takes it, held against model.fit on each case.

For each model and dict, model.fit runs first; the trainer must then train to the same loss where it
trains, and refuse (before anything changes, naming the keys) where it fails. Keras's warnings show once.
"""

import warnings

import keras
import numpy as np
import pytest

from conftest import mirrored, run_script
from trainer import Trainer, _compat

N = 32
RNG = np.random.default_rng(0)
COLUMNS = {name: RNG.normal(size=(N, width)).astype("float32")
           for name, width in (("age", 2), ("size", 3), ("id", 3), ("c", 4), ("weight", 4), ("b", 2))}
Y = RNG.integers(0, 3, N)


def _model(built_on):
    keras.utils.set_random_seed(0)
    if built_on == "dict":  # keys in another order than sorted
        inputs = {"size": keras.Input((3,), name="size"), "age": keras.Input((2,), name="age")}
        parts = [inputs["size"], inputs["age"]]
    else:
        inputs = parts = [keras.Input((3,), name="size"), keras.Input((2,), name="age")]
    model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Concatenate()(parts)))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _dict(*keys):
    return {key: COLUMNS[key] for key in keys}


CASES = {  # (model built on, the data's keys)
    "dict-model/same-keys": ("dict", ("age", "size")),
    "dict-model/keys-after": ("dict", ("age", "size", "weight")),  # Keras warns, feeds by sorted position
    "dict-model/key-among": ("dict", ("age", "id", "size")),  # sorted: Keras feeds 'id' to 'size' and trains
    "dict-model/wide-key-among": ("dict", ("age", "c", "size")),  # sorted: 'c' to 'size', whose shape differs
    "dict-model/key-missing": ("dict", ("age", "weight")),
    "list-model/same-keys": ("list", ("size", "age")),
    "list-model/more-keys": ("list", ("age", "b", "id", "size")),  # by name, others ignored
    "list-model/key-missing": ("list", ("size", "b")),
}


def _keras_fit(built_on, x):
    model = _model(built_on)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            history = model.fit(x, Y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        except ValueError as err:
            return None, str(err), set()
    return history.history["loss"], None, _kinds(caught)


def _kinds(caught):
    """Keras's warnings by their first line (the rest shows shapes, whose batch size is the caller's)."""
    return {str(w.message).splitlines()[0] for w in caught if "keras" in w.filename}


# Up to Keras 3.15 a dict model takes a dict's values in sorted key order: with a key among its inputs' it trains
# on the wrong column, and the trainer refuses, naming the column and the input (a deliberate limit). From 3.16
# it takes them by name, and both train on the right columns.
BY_NAME = _compat.KERAS_VERSION >= (3, 16)
KERAS_MISFEEDS = set() if BY_NAME else {"dict-model/key-among"}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_dict_of_data_trains_where_model_fit_trains_and_is_refused_where_it_fails(case, replicas):
    built_on, keys = CASES[case]
    x = _dict(*keys)
    keras_loss, keras_error, keras_warnings = _keras_fit(built_on, x)
    model = _model(built_on)
    trainer = Trainer(strategy="default" if replicas == 1 else mirrored(2), batch_size=8, verbose=0)
    if keras_error is not None or case in KERAS_MISFEEDS:
        before = [w.copy() for w in model.get_weights()]
        with pytest.raises(ValueError, match=r"x (must have a key for each model input|has keys beyond)") as err:
            trainer.fit(model, x, Y, epochs=1, shuffle=False)
        assert "Received: x with keys" in str(err.value)
        for a, b in zip(before, model.get_weights()):
            np.testing.assert_array_equal(a, b)
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = trainer.fit(model, x, Y, epochs=1, shuffle=False)
    np.testing.assert_allclose(history.history["loss"], keras_loss, rtol=1e-5)
    assert _kinds(caught) == keras_warnings


def test_the_cases_cover_each_outcome():
    runs = {case: _keras_fit(built_on, _dict(*keys)) for case, (built_on, keys) in CASES.items()}
    trains = {case: error is None for case, (_, error, _) in runs.items()}
    assert trains == {"dict-model/same-keys": True, "dict-model/keys-after": True, "dict-model/key-among": True,
                      "dict-model/wide-key-among": BY_NAME, "dict-model/key-missing": False,
                      "list-model/same-keys": True, "list-model/more-keys": True, "list-model/key-missing": False}
    assert runs["dict-model/keys-after"][2]  # Keras warns about the structure, and goes on
    # Where Keras misfeeds, it trains on other numbers than on the right columns; by name, on the same.
    assert np.allclose(runs["dict-model/key-among"][0], runs["dict-model/same-keys"][0]) == BY_NAME


WORKER_SCRIPT = """
from trainer import Trainer, _compat
trainer = Trainer(strategy="multi_worker", batch_size=8, verbose=0)
import keras, numpy as np
inputs = {"size": keras.Input((3,), name="size"), "age": keras.Input((2,), name="age")}
model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Concatenate()([inputs["size"], inputs["age"]])))
model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
x = {"age": np.ones((32, 2), "float32"), "size": np.ones((32, 3), "float32"), "weight": np.ones((32, 4), "float32")}
trainer.fit(model, x, np.zeros(32, "int32"), epochs=1)
print("trained", flush=True)
"""


@pytest.mark.slow
def test_keras_warnings_show_once_on_the_chief_of_two_workers(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(WORKER_SCRIPT)
    proc = run_script(script, launch=("--workers", 2), timeout=240)
    lines = [line for line in proc.stdout.splitlines() if "The structure of `inputs` doesn't match" in line]
    assert lines and all(line.startswith("[worker:0]") for line in lines), proc.stdout[-3000:]
    assert "[worker:0] trained" in proc.stdout and "[worker:1] trained" in proc.stdout


def _shown(fit) -> list[str]:
    """The first lines of Keras's warnings that Python's default filter shows during `fit` (each text once)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        fit()
    return sorted(str(w.message).splitlines()[0] for w in caught if "keras" in w.filename)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_warning_about_the_inputs_shows_as_often_as_under_model_fit(replicas):
    """Keras's warning names the inputs' shapes: the trainer's build on another number of rows than its
    steps' showed it twice. (An uneven last batch, which the trainer's step traces with its own shape and
    Keras's with an open one, still shows it once more.)"""
    inputs = {"a": keras.Input((3,), name="a"), "b": keras.Input((2,), name="b")}

    def model():
        keras.utils.set_random_seed(0)
        built = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Concatenate()([inputs["a"], inputs["b"]])))
        built.compile("sgd", "mse")
        return built

    x, y = [np.ones((16, 3), "float32"), np.ones((16, 2), "float32")], np.ones((16, 1), "float32")
    expected = _shown(lambda: model().fit(x, y, batch_size=8, epochs=2, verbose=0))
    trainer = Trainer(strategy="default" if replicas == 1 else mirrored(2), batch_size=8, verbose=0)
    assert expected == ["The structure of `inputs` doesn't match the expected structure."]
    assert _shown(lambda: trainer.fit(model(), x, y, epochs=2)) == expected
