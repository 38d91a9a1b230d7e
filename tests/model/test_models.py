"""Models in and out of the strategy's scope, builders, subclassed and multi-output models."""

import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import LearningRateSeen, mirrored, tiny_model
from trainer import Trainer


@pytest.mark.slow
def test_a_model_built_outside_scope_trains_in_place_and_goes_home(data):
    x, y, w = data
    model = tiny_model()
    before = [v.copy() for v in model.get_weights()]
    history = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0).fit(model, (x, y), epochs=2)
    assert history.model is model  # moved into the scope, not re-created
    assert not any(isinstance(v.value, tf.distribute.DistributedValues) for v in model.variables)  # home again
    assert not any(isinstance(v.value, tf.distribute.DistributedValues) for v in model.optimizer.variables)
    assert int(model.optimizer.iterations.numpy()) == 2 * 7
    assert any(not np.array_equal(b, a) for b, a in zip(before, model.get_weights()))
    assert model.get_compile_config()["weighted_metrics"]  # compile settings untouched
    np.testing.assert_allclose(model.predict(x, verbose=0), Trainer(strategy=mirrored(2), verbose=0).predict(model, x),
                               rtol=1e-5, atol=1e-6)
    model.fit(x, y, epochs=1, verbose=0)  # Keras's own fit continues from there, without a strategy
    assert int(model.optimizer.iterations.numpy()) == 2 * 7 + 7


def test_the_plan_names_the_move_of_a_model_built_outside_the_scope(data, capsys):
    x, y, w = data
    Trainer(strategy=mirrored(2), batch_size=32, verbose=2).fit(tiny_model(), (x, y), epochs=1)
    assert re.search(r"model +your Sequential, built outside the strategy's scope: its \d+ variables",
                     capsys.readouterr().out)
    Trainer(strategy=mirrored(2), batch_size=32, verbose=2).fit(tiny_model, (x, y), epochs=1)  # a builder
    assert "built outside the strategy's scope" not in capsys.readouterr().out


def test_second_fit_continues_and_the_learning_rate_is_scaled_only_during_a_fit(data):
    x, y, w = data
    trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, lr_scaling="linear", verbose=0)
    during = LearningRateSeen()
    model = trainer.fit(lambda: tiny_model(lr=0.01), (x, y), epochs=1, callbacks=[during]).model
    iterations = int(model.optimizer.iterations.numpy())
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.01)  # as tuned, between fits
    history = trainer.fit(model, (x, y), epochs=1, callbacks=[during])
    assert history.model is model
    assert int(model.optimizer.iterations.numpy()) == 2 * iterations
    assert during.seen == [pytest.approx(0.02)] * 2  # scaled once for 2 replicas, in each fit
    assert "learning_rate" not in history.history  # Keras's keys: only its LR callbacks add it
def test_builder_is_called_in_scope_and_history_has_the_model(data):
    x, y, w = data
    calls = []

    def build():
        calls.append(tf.distribute.has_strategy())
        return tiny_model()

    history = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0).fit(build, (x, y), epochs=1)
    assert calls == [True]
    assert isinstance(history.model.weights[0].value, tf.distribute.DistributedValues)


class NoConfigModel(keras.Model):
    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(units, activation="relu")
        self.out = keras.layers.Dense(3)

    def call(self, x):
        return self.out(self.hidden(x))


def _compiled_subclass():
    model = NoConfigModel(16)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def test_subclassed_model_without_config_trains_in_place(data):
    x, y, w = data
    model = _compiled_subclass()
    model(x[:2])  # built outside any scope
    history = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0).fit(model, (x, y), epochs=2)
    assert history.model is model and history.history["loss"][1] < history.history["loss"][0]


def test_subclassed_model_through_a_builder(data):
    x, y, w = data
    history = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0).fit(
        _compiled_subclass, (x, y), epochs=2)
    assert history.history["loss"][1] < history.history["loss"][0]


def _two_headed(learning_rate=0.0, run_eagerly=False):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,), name="features")
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    outputs = {
        "cls": keras.layers.Dense(3, name="cls")(hidden),
        "reg": keras.layers.Dense(1, name="reg")(hidden),
    }
    model = keras.Model(inputs, outputs)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate),
        loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "reg": "mse"},
        loss_weights={"cls": 1.0, "reg": 0.5},
        metrics={"cls": ["accuracy"]},
        run_eagerly=run_eagerly,
    )
    return model


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_each_outputs_loss_is_keras_eager_runs_on_any_replica_count(data, replicas):
    """Keras's compiled step weighs each output's logged loss by the traced batch's static size, 1 where it is
    unknown; its eager run by the batch's size. The trainer gives the eager run's history and evaluate."""
    x, y, _ = data
    targets = {"cls": y, "reg": x[:, :1] * 2.0}
    eager = _two_headed(0.05, run_eagerly=True)
    history = eager.fit(x, targets, batch_size=32, epochs=2, shuffle=False, verbose=0).history
    evaluated = eager.evaluate(x, targets, batch_size=32, return_dict=True, verbose=0)
    trainer = Trainer(strategy=mirrored(replicas) if replicas > 1 else "default", batch_size=32, verbose=0)
    model = _two_headed(0.05)
    ours = trainer.fit(model, (x, targets), epochs=2, shuffle=False).history
    assert sorted(ours) == sorted(history)
    for key in history:
        np.testing.assert_allclose(ours[key], history[key], rtol=1e-5, err_msg=key)
    for key, value in trainer.evaluate(model, (x, targets), return_dict=True).items():
        np.testing.assert_allclose(value, evaluated[key], rtol=1e-5, err_msg=key)
    for a, b in zip(model.get_weights(), eager.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_multi_output_losses_are_weighted_per_output(data):
    x, y, w = data  # 203 examples: a last batch of 11
    targets = {"cls": y, "reg": x[:, :1] * 2.0}
    trainer = Trainer(strategy=mirrored(4), batch_size=32, verbose=0)
    model = trainer.fit(_two_headed, (x, targets), epochs=1).model
    result = trainer.evaluate(model, (x, targets), return_dict=True)
    pred = model.predict(x, verbose=0)
    logits = pred["cls"] - pred["cls"].max(axis=1, keepdims=True)
    ce = -(logits - np.log(np.exp(logits).sum(axis=1, keepdims=True)))[np.arange(len(y)), y]
    mse = ((pred["reg"] - targets["reg"]) ** 2).mean(axis=1)
    # Each output's loss is a mean over examples, as the total loss is, so that they add up as the loss weights
    # say; Keras's graph logs the mean over batches instead (docs/exactness.md), its eager run this.
    np.testing.assert_allclose(result["cls_loss"], ce.mean(), rtol=1e-5)
    np.testing.assert_allclose(result["reg_loss"], mse.mean(), rtol=1e-5)
    np.testing.assert_allclose(result["loss"], ce.mean() + 0.5 * mse.mean(), rtol=1e-5)
    np.testing.assert_allclose(result["loss"], result["cls_loss"] + 0.5 * result["reg_loss"], rtol=1e-5)
    batch_mean = np.mean([ce[i:i + 32].mean() for i in range(0, len(ce), 32)])
    assert not np.isclose(result["cls_loss"], batch_mean, rtol=1e-4)  # the uneven last batch tells them apart
    np.testing.assert_allclose(result["cls_accuracy"], np.mean(pred["cls"].argmax(1) == y), rtol=1e-6)
    out = trainer.predict(model, x)
    np.testing.assert_allclose(out["reg"], pred["reg"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_dataset_and_function_inputs_match_arrays(data):
    x, y, w = data  # 203 examples: the last global batch of 32 holds 11, split 3/3/3/2
    strategy = mirrored(4)
    trainer = Trainer(strategy=strategy, batch_size=32, shuffle=False, lr_scaling=None, verbose=0)
    from_arrays = trainer.fit(tiny_model(), (x, y, w), epochs=2).history

    dataset = tf.data.Dataset.from_tensor_slices((x, y, w))
    from_dataset = trainer.fit(tiny_model(), dataset, epochs=2).history

    def dataset_fn(ctx):
        per_replica = ctx.get_per_replica_batch_size(32)
        return tf.data.Dataset.from_tensor_slices((x, y, w)).batch(32).rebatch(
            [per_replica] * ctx.num_replicas_in_sync).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

    from_function = trainer.fit(tiny_model(), dataset_fn, epochs=2).history
    for key in ("loss", "accuracy", "wce"):
        np.testing.assert_allclose(from_dataset[key], from_arrays[key], rtol=1e-5, err_msg=key)
        np.testing.assert_allclose(from_function[key], from_arrays[key], rtol=1e-5, err_msg=key)


@pytest.mark.slow
def test_predict_keeps_input_order_with_an_uneven_split(data):
    x, y, w = data
    model = tiny_model()
    out = Trainer(strategy=mirrored(4), batch_size=8, verbose=0).predict(model, x)
    assert out.shape == (203, 3)
    np.testing.assert_allclose(out, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    unbatched = Trainer(strategy=mirrored(4), batch_size=8, verbose=0).predict(
        model, tf.data.Dataset.from_tensor_slices(x))
    np.testing.assert_allclose(unbatched, out, rtol=1e-6)


@pytest.mark.slow
def test_dict_inputs_under_four_replicas(data):
    x, y, w = data
    inputs = {"a": keras.Input((4,), name="a"), "b": keras.Input((4,), name="b")}
    merged = keras.layers.Concatenate()([inputs["a"], inputs["b"]])
    model = keras.Model(inputs, keras.layers.Dense(3)(merged))
    model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    features = {"a": x[:, :4], "b": x[:, 4:]}
    trainer = Trainer(strategy=mirrored(4), batch_size=32, verbose=0)
    history = trainer.fit(model, (features, y), epochs=1, validation_data=(features, y))
    logits = model.predict(features, verbose=0)
    np.testing.assert_allclose(trainer.predict(history.model, features), logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history.history["val_accuracy"][0], np.mean(logits.argmax(1) == y), rtol=1e-6)


@pytest.mark.slow
def test_a_model_built_outside_scope_keeps_its_optimizer_state_across_fits(data):
    x, y, w = data
    model = tiny_model()
    trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0)
    trainer.fit(model, (x, y), epochs=1)
    engines = list(trainer._runs.engines)
    second = trainer.fit(model, (x, y), epochs=1)
    assert second.model is model
    assert trainer._runs.engines == engines  # the in-scope variables are filled again: the traced steps are reused
    assert int(model.optimizer.iterations.numpy()) == 2 * 7


@pytest.mark.slow
def test_fine_tuning_a_model_built_outside_scope_takes_the_new_trainable_flags_and_compile(data):
    x, y, w = data
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model = tiny_model()
    model.layers[0].trainable = False
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss=loss)
    frozen = [v.copy() for v in model.layers[0].get_weights()]
    trainer = Trainer(strategy=mirrored(2), per_replica_batch_size=16, lr_scaling=None, verbose=0)
    first = trainer.fit(model, (x, y), epochs=1)
    for before, after in zip(frozen, model.layers[0].get_weights()):
        np.testing.assert_array_equal(before, after)

    model.layers[0].trainable = True  # unfreeze and recompile, as a fine-tuning recipe does
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, metrics=["accuracy"])
    second = trainer.fit(model, (x, y), epochs=1)
    assert first.model is second.model is model
    assert isinstance(second.model.optimizer, keras.optimizers.Adam)
    assert second.model.optimizer.learning_rate.numpy() == pytest.approx(1e-3)
    assert int(second.model.optimizer.iterations.numpy()) == 7  # a new optimizer starts afresh
    assert "accuracy" in second.history
    assert all(not np.array_equal(b, a) for b, a in zip(frozen, model.layers[0].get_weights()))
    engines = list(trainer._runs.engines)
    trainer.fit(model, (x, y), epochs=1)
    assert trainer._runs.engines == engines  # unchanged since: its steps are reused


@pytest.mark.slow
def test_engine_cache_is_bounded(data):
    from trainer.engine.engine import CACHE_SIZE

    x, y, w = data
    trainer = Trainer(strategy="default", verbose=0)
    for _ in range(CACHE_SIZE + 2):
        trainer.evaluate(tiny_model(), (x, y))
    assert len(trainer._runs.engines) == CACHE_SIZE


@pytest.mark.slow
def test_a_model_built_under_another_strategy_continues_under_the_requested_one(data):
    x, y, w = data
    two, four = mirrored(2), mirrored(4)
    options = dict(batch_size=32, lr_scaling=None, verbose=0)
    first = Trainer(strategy=two, **options).fit(tiny_model, (x, y), epochs=1).model
    assert two.extended.variable_created_in_scope(first.weights[0].value)

    history = Trainer(strategy=four, **options).fit(first, (x, y), epochs=2, initial_epoch=1)
    assert history.model is first
    assert all(two.extended.variable_created_in_scope(v.value) for v in first.weights)  # home: under `two`
    assert int(first.optimizer.iterations.numpy()) == 2 * 7  # the optimizer's step and momentum came along
    # Independently: both epochs in one fit without any strategy.
    reference = Trainer(strategy="default", **options).fit(tiny_model(), (x, y), epochs=2).model
    for got, want in zip(first.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    evaluation = Trainer(strategy=four, **options).evaluate(first, (x, y), return_dict=True)
    for key, value in Trainer(strategy="default", **options).evaluate(reference, (x, y), return_dict=True).items():
        assert evaluation[key] == pytest.approx(value, rel=1e-5), key
    np.testing.assert_allclose(Trainer(strategy=four, **options).predict(first, x), reference.predict(x, verbose=0),
                               rtol=1e-5, atol=1e-6)


def _stateful_model(batch: int = 4) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input(batch_shape=(batch, 5, 2)), keras.layers.LSTM(3, stateful=True),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse", metrics=[keras.metrics.MeanAbsoluteError()])
    return model


def _sequences(n: int = 16):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 5, 2)).astype("float32"), rng.normal(size=(n, 1)).astype("float32")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["default", "mirrored1"])
def test_a_stateful_rnn_trains_on_one_device_as_model_fit_does(strategy):
    x, y = _sequences()
    ours, theirs = _stateful_model(), _stateful_model()
    trainer = Trainer(strategy=mirrored(1) if strategy == "mirrored1" else strategy, batch_size=4, shuffle=False,
                      verbose=0)
    history = trainer.fit(ours, (x, y), epochs=2)
    keras_history = theirs.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    assert history.model is ours
    for key, values in keras_history.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)
    for a, b in zip(ours.get_weights(), theirs.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    # The states carry on from training in both, as each call moves them on.
    assert trainer.evaluate(ours, (x, y)) == pytest.approx(theirs.evaluate(x, y, batch_size=4),
                                                           rel=1e-5)
    np.testing.assert_allclose(trainer.predict(ours, x), theirs.predict(x, batch_size=4, verbose=0), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("trainer_args,rows,message", [
    (dict(strategy="mirrored2", batch_size=4), 16, "can't split that batch across replicas.*2 replicas"),
    (dict(strategy="default", batch_size=8), 16, "`batch_size` must be 4.*global batch of 8.*batch_size=4"),
    (dict(strategy="default", batch_size=4), 14, "multiple of 4 examples.*14 examples.*last batch of 2.*x\\[:12\\]"),
])
def test_a_stateful_rnn_is_refused_what_it_cannot_run_before_anything_changes(trainer_args, rows, message):
    x, y = _sequences(rows)
    model = _stateful_model()
    before = [v.copy() for v in model.get_weights()]
    if trainer_args["strategy"] == "mirrored2":
        trainer_args = dict(trainer_args, strategy=mirrored(2))
    with pytest.raises(ValueError, match=message):
        Trainer(verbose=0, **trainer_args).fit(model, (x, y))
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(model.optimizer.iterations.numpy()) == 0


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_model_with_a_fixed_batch_shape_trains_as_model_fit_does(replicas):
    x, y = _sequences(14)
    x = x[:, 0, :]

    def make():
        keras.utils.set_random_seed(0)
        inputs = keras.Input(batch_shape=(4, 2))
        model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(3, activation="tanh")(inputs)))
        model.compile(keras.optimizers.SGD(0.1), "mse")
        return model

    strategy = mirrored(replicas) if replicas > 1 else "default"
    history = Trainer(strategy=strategy, batch_size=4, shuffle=False, verbose=0).fit(make(), (x, y), epochs=2)
    reference = make()
    keras_history = reference.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)  # a last batch of 2
    np.testing.assert_allclose(history.history["loss"], keras_history.history["loss"], rtol=1e-5)
    for a, b in zip(history.model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def _batch_norm_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4), keras.layers.BatchNormalization(name="bn"),
                              keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_batch_norm_takes_the_global_batchs_statistics_on_replicas_by_default(data):
    x, y, _ = data
    x, y = x[:203], y[:203]  # a last batch of 11: 6 + 5 on two replicas
    ours, reference = _batch_norm_model(), _batch_norm_model()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # nothing to warn of: the statistics are one device's
        history = Trainer(strategy=mirrored(2), batch_size=32, shuffle=False, verbose=0).fit(ours, (x, y), epochs=2)
    keras_history = reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], keras_history.history["loss"], rtol=1e-5)
    for a, b in zip(ours.get_weights(), reference.get_weights()):  # moving mean and variance included
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert ours.get_layer("bn").synchronized is False  # the user's layer as it was


def test_global_batch_norm_statistics_hold_for_features_far_from_zero():
    # Features whose mean (1000) is large against their spread (0.01): a variance taken as E[x^2] - E[x]^2
    # loses every digit in float32, so the moving variance would come out 0 or far off on two replicas.
    rng = np.random.default_rng(0)
    x = (1000 + 0.01 * rng.standard_normal((70, 8))).astype("float32")
    y = rng.integers(0, 3, 70)

    def make():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((8,)), keras.layers.BatchNormalization(name="bn"),
                                  keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    ours, reference = make(), make()
    Trainer(strategy=mirrored(2), batch_size=16, shuffle=False, verbose=0).fit(ours, (x, y), epochs=2)
    reference.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    # The weights trained on the normalized features are not compared: one ulp of the mean (6e-5 at 1000)
    # already moves them by 0.6%, on one device as on several.
    for name in ("moving_mean", "moving_variance"):
        ours_value, reference_value = (getattr(m.get_layer("bn"), name).numpy() for m in (ours, reference))
        np.testing.assert_allclose(ours_value, reference_value, rtol=1e-5)


def test_per_replica_batch_norm_is_named_in_a_warning(data):
    x, y, w = data
    with pytest.warns(UserWarning, match="bn normalize each replica's share"):
        Trainer(strategy=mirrored(2), batch_size=32, verbose=0, batch_norm="per_replica").fit(
            _batch_norm_model, (x, y), epochs=1)


@pytest.mark.slow
def test_an_adapted_lookup_layer_trains_with_its_vocabulary_as_under_model_fit():
    def make():
        keras.utils.set_random_seed(0)
        lookup = keras.layers.StringLookup(name="words")
        lookup.adapt(np.array(["a", "b", "c"]))
        inputs = keras.Input((), dtype="string")
        model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Embedding(5, 2)(lookup(inputs))))
        model.compile(keras.optimizers.SGD(0.1), "mse")
        return model

    x, y = np.array(["a", "b", "c", "a", "d", "b"], dtype=object), np.arange(12, dtype="float32").reshape(6, 2) / 10
    ours, theirs = make(), make()
    history = Trainer(strategy=mirrored(2), batch_size=4, shuffle=False, verbose=0).fit(ours, (x, y), epochs=2)
    reference = theirs.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(history.history["loss"], reference.history["loss"], rtol=1e-5)
    for a, b in zip(ours.get_weights(), theirs.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(ours.predict(x, verbose=0), theirs.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_model_built_outside_the_scope_keeps_unregistered_custom_loss_and_metric(data):
    import parity_cases  # the Keras guide's CustomMSE and CategoricalTruePositives, never registered

    x, y, w = data
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.05), loss=parity_cases.CustomMSE(),
                  metrics=[parity_cases.CategoricalTruePositives()])
    targets = keras.utils.to_categorical(y, 3)
    history = Trainer(strategy=mirrored(2), batch_size=32, lr_scaling=None, verbose=0).fit(model, (x, targets))
    assert set(history.history) >= {"loss", "categorical_true_positives"}
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.slow
def test_a_model_with_its_own_compile_trains_in_place_with_both_optimizers(data):
    # A GAN's compile(d_optimizer=..., g_optimizer=...): nothing to repeat, the user's object trains.
    import sys

    from conftest import TESTS

    sys.path.insert(0, str(TESTS))
    import parity_cases

    x, _, _ = parity_cases._regression()
    gan = parity_cases._gan()
    history = Trainer(strategy=mirrored(2), batch_size=8, verbose=0).fit(gan, (x, x[:, :1]), epochs=1)
    assert history.model is gan
    assert {"d_loss", "g_loss"} <= set(history.history) and np.isfinite(history.history["d_loss"][0])
    steps = -(-len(x) // 8)
    assert int(gan.d_optimizer.iterations.numpy()) == int(gan.g_optimizer.iterations.numpy()) == steps
    assert not any(isinstance(v.value, tf.distribute.DistributedValues)
                   for v in gan.d_optimizer.variables + gan.g_optimizer.variables)  # home, built in the step


class _Scale(keras.layers.Layer):  # unregistered, no get_config of its own
    def build(self, shape):
        self.w = self.add_weight(shape=(shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.w


class _Factor(keras.layers.Layer):  # unregistered; Keras records `factor` from __init__
    def __init__(self, factor, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def call(self, x):
        return x * self.factor


class _Opaque(keras.layers.Layer):  # its get_config leaves out an __init__ argument
    def __init__(self, table, **kwargs):
        super().__init__(**kwargs)
        self.table = table

    def get_config(self):
        return super().get_config()

    def call(self, x):
        return x * self.table[0]


def _functional(layer):
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(3)(layer(inputs)))
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("layer", [lambda: _Factor(0.5), _Scale, lambda: _Opaque([2.0])],
                         ids=["init_argument", "no_config", "config_missing_an_argument"])
def test_custom_layers_train_in_place_whatever_their_config(data, layer):
    x, y, w = data
    model = _functional(layer())
    before = [v.copy() for v in model.get_weights()]
    history = Trainer(strategy=mirrored(2), per_replica_batch_size=16, verbose=0).fit(model, (x, y), epochs=1)
    assert history.model is model
    assert any(not np.array_equal(b, a) for b, a in zip(before, model.get_weights()))


@pytest.mark.slow
def test_after_fit_the_model_works_without_any_strategy_and_on_other_layouts(data, tmp_path):
    # One object fitted on 2 replicas, then 3, then the default strategy, continues as three model.fit calls.
    x, y, w = data
    ours, theirs = tiny_model(optimizer="adam", lr=0.01), tiny_model(optimizer="adam", lr=0.01)
    for strategy in (mirrored(2), mirrored(3), "default"):
        Trainer(strategy=strategy, batch_size=32, lr_scaling=None, shuffle=False, verbose=0).fit(ours, (x, y))
        theirs.fit(x, y, batch_size=32, shuffle=False, verbose=0)

    def state(model):
        return model.get_weights() + [v.numpy() for v in model.optimizer.variables]

    for a, b in zip(state(ours), state(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Keras's own calls, without any strategy, as after model.fit.
    expected = theirs.predict(x, verbose=0)
    np.testing.assert_allclose(ours.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.evaluate(x, y, verbose=0), theirs.evaluate(x, y, verbose=0), rtol=1e-5)
    ours.save(tmp_path / "model.keras")
    reloaded = keras.models.load_model(tmp_path / "model.keras")
    np.testing.assert_allclose(reloaded.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
    assert int(reloaded.optimizer.iterations.numpy()) == int(theirs.optimizer.iterations.numpy()) == 3 * 7
    ours.save_weights(tmp_path / "model.weights.h5")
    fresh = tiny_model(seed=1)
    fresh.load_weights(tmp_path / "model.weights.h5")
    np.testing.assert_allclose(fresh.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-6)
    ours.export(tmp_path / "exported")
    exported = tf.saved_model.load(str(tmp_path / "exported"))  # kept: its variables live as long as it does
    np.testing.assert_allclose(exported.serve(tf.constant(x)).numpy(), expected, rtol=1e-5, atol=1e-6)
    ours.fit(x, y, batch_size=32, shuffle=False, verbose=0)
    theirs.fit(x, y, batch_size=32, shuffle=False, verbose=0)
    for a, b in zip(state(ours), state(theirs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


_RNG = np.random.default_rng(0)
_X = _RNG.normal(size=(40, 5)).astype("float32")
_TARGETS = {  # (targets, output units, activation): what Keras's "crossentropy" becomes for each
    "binary": ((_X[:, 0] > 0).astype("float32"), 1, "sigmoid"),
    "sparse categorical": (_RNG.integers(0, 3, 40), 3, "softmax"),
    "categorical": (np.eye(3, dtype="float32")[_RNG.integers(0, 3, 40)], 3, "softmax"),
}


@pytest.mark.parametrize("name", ["crossentropy", "ce"])
@pytest.mark.parametrize("kind", list(_TARGETS))
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_loss_named_crossentropy_resolves_as_keras_resolves_it(kind, name, replicas):
    y, units, activation = _TARGETS[kind]

    def model():
        keras.utils.set_random_seed(0)
        built = keras.Sequential([keras.Input((5,)), keras.layers.Dense(units, activation=activation)])
        built.compile("sgd", loss=name, metrics=["accuracy"])
        return built

    reference, trained = model(), model()
    expected = reference.fit(_X, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    history = Trainer(strategy=mirrored(replicas), lr_scaling=None, verbose=0).fit(trained, _X, y, batch_size=8,
                                                                                  epochs=2, shuffle=False)
    assert sorted(history.history) == sorted(expected.history)
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-5, err_msg=key)
    for got, want in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sparse_labels_out_of_range_are_refused_under_crossentropy_too():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("sgd", loss="crossentropy")
    with pytest.raises(ValueError, match=r"must hold class indices in \[0, 3\)"):
        Trainer(strategy="default", verbose=0).fit(model, _X, np.full(40, 3), batch_size=8)
