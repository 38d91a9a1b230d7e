"""TensorFlow's "Distributed input" forms: datasets the user distributed, and dataset functions.

Each layout (1, 2 and 3 CPU replicas, 2 through the accelerator reader, 2 workers through trainer-launch) trains
every form through the trainer and inside `Trainer.distribute()` (tests/scripts/distributed_input_run.py), against
`model.fit` on one device on the batched dataset the forms are made from: history (keys too), evaluate, weights,
predictions and the optimizer's step count. The refusals run in-process.
"""


import numpy as np
import pytest
import tensorflow as tf

from conftest import load_run, mirrored, run_script, SCRIPTS, tiny_data, tiny_model
from trainer import Trainer
from trainer.data import readers

pytestmark = pytest.mark.slow  # subprocesses, layouts or whole trainings: not in the everyday tier

SCRIPT = str(SCRIPTS / "distributed_input_run.py")
FORMS = ["block_distributed_dataset", "block_function", "distributed_dataset", "distributed_function", "function"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    run_script(SCRIPT, out, "--reference")
    results, arrays = load_run(out, "single0")
    return results["reference"], {key.split("/")[1]: value for key, value in arrays.items()}


def _assert_one_device(results, arrays, reference):
    expected, expected_arrays = reference
    assert sorted(results) == FORMS
    for form, result in results.items():
        assert sorted(result["history"]) == sorted(expected["history"]), form
        for key, values in expected["history"].items():
            np.testing.assert_allclose(result["history"][key], values, rtol=1e-5, err_msg=f"{form}: {key}")
        for key, value in expected["evaluate"].items():
            np.testing.assert_allclose(result["evaluate"][key], value, rtol=1e-5, err_msg=f"{form}: {key}")
        assert result["iterations"] == expected["iterations"], form
        for key in ("weights", "predictions"):
            np.testing.assert_allclose(arrays[f"{form}/{key}"], expected_arrays[key], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{form}: {key}")


@pytest.mark.parametrize("replicas", [1, 2, 3])
def test_every_form_gives_one_devices_numbers_on_replicas(tmp_path, reference, replicas):
    run_script(SCRIPT, tmp_path, "--replicas", str(replicas))
    _assert_one_device(*load_run(tmp_path, "single0"), reference)


def test_every_form_gives_one_devices_numbers_through_the_accelerator_reader(tmp_path, reference):
    """2 CPU replicas reading as GPUs and TPUs do (TensorFlow's distributed iterator)."""
    run_script(SCRIPT, tmp_path, "--replicas", "2", env={readers.ACCELERATOR_READER: "1"})
    _assert_one_device(*load_run(tmp_path, "single0"), reference)


def test_every_form_gives_one_devices_numbers_on_two_workers(tmp_path, reference):
    """Each worker's pipeline reads its shard of the rows (`input_context`), and the dataset distributed
    whole is cut by the trainer: both give one device's batches of 48."""
    run_script(SCRIPT, tmp_path, launch=("--workers", "2"))
    for task in ("worker0", "worker1"):
        _assert_one_device(*load_run(tmp_path, task), reference)


def _per_replica_fn(x, y, w, global_batch):
    def fn(context):
        data = tf.data.Dataset.from_tensor_slices((x, y, w))
        return data.batch(context.get_per_replica_batch_size(global_batch))
    return fn


def test_a_dataset_functions_batch_is_the_plans_and_keeps_the_learning_rate(capsys):
    x, y, w = tiny_data(96)
    fn = _per_replica_fn(x, y, w, 32)
    history = Trainer(strategy=mirrored(2), verbose=1).fit(tiny_model(optimizer="adam", lr=0.01), fn, epochs=1)
    plan = capsys.readouterr().out
    assert "global 32 = 16 per replica x 2 (the dataset function's batches)" in plan
    assert float(history.model.optimizer.learning_rate.numpy()) == pytest.approx(0.01)


@pytest.mark.parametrize("trainer_args, fit_args, named", [
    ({"per_replica_batch_size": 64}, {}, "Trainer(per_replica_batch_size=64) (a global batch of 128)"),
    ({"batch_size": 64}, {}, "Trainer(batch_size=64) (a global batch of 64)"),
    ({}, {"batch_size": 50}, "fit's batch_size=50 (a global batch of 50)"),
])
def test_a_batch_given_that_contradicts_a_dataset_function_is_refused_naming_both(trainer_args, fit_args, named):
    x, y, w = tiny_data(96)
    model = tiny_model()
    before = [v.numpy() for v in model.weights]
    with pytest.raises(ValueError, match="makes batches of 16 per replica, a global batch of 32") as err:
        Trainer(strategy=mirrored(2), verbose=0, **trainer_args).fit(model, _per_replica_fn(x, y, w, 32), **fit_args)
    assert named in str(err.value)
    for value, variable in zip(before, model.weights):
        np.testing.assert_array_equal(value, variable.numpy())  # refused before anything changed


def test_a_batch_given_that_agrees_with_a_dataset_function_trains():
    x, y, w = tiny_data(96)
    history = Trainer(strategy=mirrored(2), batch_size=32, verbose=0).fit(tiny_model(), _per_replica_fn(x, y, w, 32))
    assert int(history.model.optimizer.iterations.numpy()) == 96 // 32  # the function's batches of 16 x 2
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.parametrize("distributed", [False, True], ids=["function", "distributed from it"])
def test_a_dataset_function_is_called_once_to_read_and_once_to_tell_its_batch(distributed):
    """Every epoch reads one distributed dataset, as model.fit reads the one it is given in the strategy's
    scope: the function is not called again each epoch, nor for the model's build and the pass's length."""
    x, y, w = tiny_data(96)
    strategy, contexts = mirrored(2), []

    def fn(context):
        contexts.append(context.num_replicas_in_sync)
        return tf.data.Dataset.from_tensor_slices((x, y, w)).batch(context.get_per_replica_batch_size(32))

    data = [strategy.distribute_datasets_from_function(fn) if distributed else fn for _ in range(2)]
    made = len(contexts)
    Trainer(strategy=strategy, verbose=0).fit(tiny_model(), data[0], validation_data=data[1], epochs=3)
    assert contexts[made:] == [2] * (2 if distributed else 4)  # the batch of each; the dataset read, if not given


def test_a_distributed_dataset_under_another_strategy_is_refused_naming_both():
    x, y, w = tiny_data(96)
    ours, theirs = mirrored(2), mirrored(2)
    distributed = theirs.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices((x, y)).batch(32))
    with pytest.raises(ValueError, match="distributed with MirroredStrategy") as err:
        Trainer(strategy=ours, verbose=0).fit(tiny_model(), distributed)
    assert "Received: strategy=" in str(err.value) and "'auto'" in str(err.value)
    with pytest.raises(ValueError, match="runs on the strategy that made it"):
        Trainer(strategy="one_device", verbose=0).fit(tiny_model(), distributed)


def test_x_and_validation_data_distributed_by_two_strategies_are_refused():
    x, y, w = tiny_data(96)
    batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    first, second = mirrored(2), mirrored(2)
    with pytest.raises(ValueError, match="must be distributed with the same strategy"):
        Trainer(verbose=0).fit(tiny_model(), first.experimental_distribute_dataset(batches),
                               validation_data=second.experimental_distribute_dataset(batches))
