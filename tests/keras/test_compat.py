"""trainer/_compat/: Keras's own functions are back in place after the trainer traces a step."""

import keras
import numpy as np
import pytest
from keras.src.backend.tensorflow.optimizer import TFOptimizer
from keras.src.losses import loss as loss_module
from keras.src.metrics.reduction_metrics import Mean
from keras.src.backend.tensorflow import random as tf_random
from keras.src.backend.common.variables import Variable as KerasVariable
from keras.src.optimizers.base_optimizer import BaseOptimizer
import tensorflow as tf
from tensorflow.python.distribute.parameter_server_strategy import ParameterServerStrategyExtended
from tensorflow.python.distribute.sharded_variable import ShardedVariable

from conftest import mirrored
from parity_cases import ExamplesSeen
from trainer import Trainer, _compat
from trainer._compat.replicas.batch_norm import tf_nn  # keras/src/backend/tensorflow/nn.py, or ops/nn.py on 3.16
from trainer.engine import draws
from trainer.model.route import keras_method_arguments


def _keras_functions():
    return (loss_module.scale_loss_for_distribution, loss_module.unscale_loss_for_distribution,
            TFOptimizer._all_reduce_sum_gradients, BaseOptimizer._clip_gradients, BaseOptimizer.apply,
            tf.__internal__.distribute.interim.maybe_merge_call, ParameterServerStrategyExtended._update,
            tf_nn._compute_moments_sync, KerasVariable.assign_add, KerasVariable.assign_sub, Mean.update_state,
            *(getattr(tf_random, name) for name in _compat.RANDOM_FUNCTIONS))


def test_the_hooks_are_installed_only_while_tracing_and_nest():
    before = _keras_functions()
    with _compat.replica_hooks(), draws.hooks():
        inside = _keras_functions()
        with _compat.replica_hooks(), draws.hooks():
            pass
        assert _keras_functions() == inside  # the inner exit leaves the outer's hooks
    assert _keras_functions() == before
    # Fifteen are replaced while tracing: the synchronized statistics, Keras's five random functions, six of
    # the replica shares, a variable's two updates and a loss tracker's; `maybe_merge_call` only inside the one
    # cross-replica apply.
    assert sum(a is not b for a, b in zip(before, inside)) == 15


def test_a_count_summed_over_replicas_counts_every_example_once():
    # Keras's `assign_add` is `assign(self + value)`, which a strategy sums whole over the replicas
    # (R * old + the updates: the count grows geometrically, in Keras's own fit too).
    x = np.random.RandomState(0).rand(29, 3).astype("float32")
    counts = []
    central = tf.distribute.experimental.CentralStorageStrategy(compute_devices=["/cpu:0", "/cpu:1"])
    for strategy in (None, mirrored(2), mirrored(3), central):
        model = keras.Sequential([keras.Input((3,)), ExamplesSeen(), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        if strategy is None:
            model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0)
        else:  # 8 as 4+4 and 3+3+2, the last 5 as 3+2 and 2+2+1
            Trainer(strategy=strategy, verbose=0).fit(model, x, x[:, :1], batch_size=8, epochs=2)
        counts.append(float(model.layers[0].seen.numpy()))
    assert counts == [58.0] * 4


def test_kerass_random_functions_and_seeds_are_the_ones_the_draws_replace():
    assert _compat.keras_random_module() is tf_random
    generator = keras.random.SeedGenerator(3)
    seed = _compat.keras_seed(generator)
    assert seed.dtype == tf.int32 and seed.shape == (2,)
    assert not np.array_equal(seed, _compat.keras_seed(generator))  # a SeedGenerator advances, as Keras's draw
    noise = _compat.noise_shape(tf.zeros((4, 3, 2)), (None, 1, None))
    assert [int(d) for d in noise] == [4, 1, 2]


def test_fit_leaves_keras_as_it_found_it():
    before = _keras_functions()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1, clipnorm=1.0, gradient_accumulation_steps=2), loss="mse")
    x = np.ones((16, 3), "float32")
    Trainer(batch_size=4, verbose=0).fit(model, (x, x[:, :1]), epochs=1)
    assert _keras_functions() == before


def test_step_counter_counts_every_apply_with_accumulation():
    optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=3)
    variable = keras.Variable(np.zeros(2, "float32"))
    optimizer.build([variable])
    for _ in range(7):
        optimizer.apply([np.ones(2, "float32")], [variable])
    assert int(_compat.step_counter(optimizer).numpy()) == 7
    assert int(optimizer.iterations.numpy()) == 2  # Keras counts updates there


def _split(value: np.ndarray) -> keras.Variable:
    """A Keras variable backed by a ShardedVariable of two shards along the first axis, as a
    ParameterServerStrategy with a variable_partitioner makes it."""
    variable = keras.Variable(value)
    _compat.set_backing(variable, ShardedVariable([tf.Variable(value[:3]), tf.Variable(value[3:])]))
    return variable


def test_the_gradient_of_a_sharded_variable_is_its_shards_put_together():
    rng = np.random.default_rng(0)
    table, kernel, ids = rng.normal(size=(5, 4)), rng.normal(size=(4, 2)), np.array([4, 0, 4, 2])
    split_table, split_kernel = _split(table), keras.Variable(kernel)
    whole_table, whole_kernel = keras.Variable(table), keras.Variable(kernel)

    def grads(table, kernel):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(tf.gather(table, ids), kernel) ** 2) + tf.reduce_sum(table[1:4] ** 3)
        return _compat.gradients(tape, loss, [table, kernel])

    (split_table_grad, split_kernel_grad), expected = grads(split_table, split_kernel), grads(whole_table, whole_kernel)
    np.testing.assert_allclose(tf.convert_to_tensor(split_table_grad), tf.convert_to_tensor(expected[0]), rtol=1e-6)
    np.testing.assert_allclose(split_kernel_grad, expected[1], rtol=1e-6)


def test_a_sparse_gradient_of_a_sharded_variable_stays_sparse_with_the_table_rows():
    table, ids = np.arange(20, dtype=np.float32).reshape(5, 4), np.array([4, 0, 4])
    layer = keras.layers.Embedding(5, 4)
    layer.build()
    _compat.set_backing(layer.embeddings, _compat.backing(_split(table)))
    with tf.GradientTape() as tape:  # Keras's Embedding reads the table whole, then gathers rows
        loss = tf.reduce_sum(layer(ids) * np.arange(1, 4, dtype=np.float32)[:, None])
    (grad,) = _compat.gradients(tape, loss, [layer.embeddings])
    assert isinstance(grad, tf.IndexedSlices)
    assert grad.dense_shape.numpy().tolist() == [5, 4]
    dense = tf.convert_to_tensor(grad).numpy()
    np.testing.assert_array_equal(dense[:, 0], [2, 0, 0, 0, 1 + 3])


def test_the_route_reaches_a_patch_made_before_it_inside_kerass_own_wrapper():
    """`keras_methods_hooked` goes inside the traceback filter that wraps fit, evaluate and predict (checked at
    both ends of the range, Keras 3.8 and the newest), so a wrapper kept by a library that patched
    keras.Model.fit earlier (as MLflow's autologging keeps it) reaches the dispatcher."""
    from keras_names import backend_trainer

    TensorFlowTrainer = backend_trainer()

    kept = {name: TensorFlowTrainer.__dict__[name] for name in ("fit", "evaluate", "predict")}
    calls = []

    def dispatch(name, method, model, args, kwargs):
        calls.append((name, keras_method_arguments(method, model, args, kwargs)))

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x = np.ones((4, 3), "float32")
    with _compat.keras_methods_hooked(dispatch):
        assert {name: TensorFlowTrainer.__dict__[name] for name in kept} == kept  # the wrappers stay
        kept["fit"](model, x, x[:, :1], epochs=2)
        kept["evaluate"](model, x, x[:, :1], return_dict=True)
        kept["predict"](model, x, batch_size=2)
    # each call's arguments by name, as passed (no defaults filled in)
    assert [(name, sorted(arguments)) for name, arguments in calls] == [
        ("fit", ["epochs", "x", "y"]), ("evaluate", ["return_dict", "x", "y"]), ("predict", ["batch_size", "x"])]
    assert calls[0][1]["x"] is x and calls[0][1]["epochs"] == 2
    model.fit(x, x[:, :1], verbose=0)  # after the block: Keras's own fit, not the dispatcher
    assert len(calls) == 3


def test_a_cpu_worker_gets_one_replica_per_logical_cpu_of_its_own(monkeypatch):
    """`worker_cpu_replicas` (CollectiveAllReduceExtended._initialize_local_devices): MultiWorkerMirroredStrategy
    gives a CPU worker one device; inside the hook it gets each of its own logical CPUs. Once a worker's
    server runs, the logical devices listed are the cluster's: only the task's own count."""
    from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver
    from tensorflow.python.distribute.collective_all_reduce_strategy import CollectiveAllReduceExtended

    def local_devices(worker_device=""):  # what the strategy asks when it is made (no strategy is made here)
        return CollectiveAllReduceExtended._initialize_local_devices(None, TFConfigClusterResolver(), worker_device)

    assert local_devices() == (("/device:CPU:0",), "CPU")  # TensorFlow's own rule
    with _compat.worker_cpu_replicas():
        assert local_devices() == (tuple(f"/device:CPU:{i}" for i in range(4)), "CPU")  # conftest's 4 logical CPUs
    assert local_devices() == (("/device:CPU:0",), "CPU")  # put back

    cluster = [tf.config.LogicalDevice(f"/job:worker/replica:0/task:{task}/device:CPU:{i}", "CPU")
               for task in (0, 1) for i in range(2)] + [tf.config.LogicalDevice("/job:ps/replica:0/task:1/device:CPU:0",
                                                                               "CPU")]
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: cluster)
    assert _compat.strategies._own_cpu_count("/job:worker/task:1") == 2
    assert _compat.strategies._own_cpu_count("/job:ps/task:1") == 1


def test_a_fresh_mirrored_strategy_numbers_its_collective_instances_from_the_key_given():
    """`number_instances_from` (CollectiveKeys._instance_key_table): a strategy that has launched no collective
    hands out instance keys from the number given; one that has launched one keeps TensorFlow's numbering."""
    fresh = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    keys = fresh.extended._collective_keys
    group = keys.get_group_key(["/job:localhost/replica:0/task:0/device:CPU:0",
                                "/job:localhost/replica:0/task:0/device:CPU:1"])
    device = "/job:localhost/replica:0/task:0/device:CPU:0"
    assert _compat.number_instances_from(fresh, 5_000_000)
    assert keys.get_instance_key(group, device) == 5_000_000
    assert not _compat.number_instances_from(fresh, 7_000_000)  # it has handed out a key: its numbering stays
    assert keys.get_instance_key(group, device) == 5_000_001
    assert not _compat.number_instances_from(tf.distribute.get_strategy(), 5_000_000)  # not a MirroredStrategy


def test_a_process_without_a_multi_worker_strategy_serves_no_cluster():
    """`collectives_serve_a_cluster` (context's `_collective_ops_server_def`): set by a MultiWorkerMirroredStrategy
    (tests/distribute/test_multiworker.py's tutorial test makes one in a process of its own), not by a
    MirroredStrategy."""
    from tensorflow.python.eager import context

    tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert hasattr(context.context(), "_collective_ops_server_def")
    assert not _compat.collectives_serve_a_cluster()


def test_a_grain_batch_read_by_record_has_grains_own_rows():
    """`grain_record_batches` reads into grain's BatchMapDataset: its rows of a batch are those grain's own
    batch has, and it takes only a `.batch()` with no batch_fn, right before Keras's adapter."""
    grain = pytest.importorskip("grain")  # the 'ecosystem' extra
    if not _compat.is_grain_dataset(grain.MapDataset.range(1)):
        pytest.skip("this Keras's model.fit takes no grain dataset")
    records = grain.MapDataset.source([(np.full(3, i, "float32"), np.int64(i)) for i in range(10)])
    batched = records.map(lambda r: (r[0] * 2, r[1])).batch(4)  # batches of 4, 4 and 2
    adapter = _compat.keras_adapter(batched)
    expected = list(adapter.get_tf_dataset().as_numpy_iterator())
    by_rows = _compat.grain_record_batches(adapter)
    whole = list(by_rows(lambda size: (0, size)).as_numpy_iterator())
    second_half = list(by_rows(lambda size: (size // 2, size)).as_numpy_iterator())
    assert [len(b[1]) for b in whole] == [len(b[1]) for b in second_half] == [4, 4, 2]
    for mine, half, theirs in zip(whole, second_half, expected):
        for a, b, c in zip(mine, half, theirs):
            np.testing.assert_array_equal(a, c)
            np.testing.assert_array_equal(b[len(c) // 2:], c[len(c) // 2:])
    user_batches = type("Adapter", (), {"_dataset": records.batch(4, batch_fn=lambda rows: rows)})()
    assert _compat.grain_record_batches(user_batches) is None  # whole: only the user's function makes them
    for later in (batched.map(lambda b: b), records.to_iter_dataset().batch(4)):  # mapped after batching; a stream
        assert _compat.grain_record_batches(_compat.keras_adapter(later)) is None
