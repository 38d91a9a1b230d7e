"""The plan printed at the start of fit."""

import re

import pytest
import tensorflow as tf

from trainer import Plan
from trainer.engine.plan import ONEDNN_HINT, bf16_hint, strategy_label

BASE = dict(
    strategy="MirroredStrategy", num_replicas=4, num_workers=1, global_batch_size=64, per_replica_batch_size=16,
    num_examples=1003, steps_per_epoch=16, shard_policy="OFF", shard_reason="trainer-sharded", lr_rule="linear",
    base_lr="0.1", scaled_lr="0.4", base_batch_size=16, warmup_steps=0, steps_per_execution=16, jit_compile=False,
)


def test_plan_names_every_decision():
    text = Plan(**BASE).describe()
    for expected in ("MirroredStrategy", "4 in sync over 1 worker(s)", "global 64 = 16 per replica x 4",
                     "16 (1003 examples)", "OFF: trainer-sharded", "0.1 -> 0.4 (linear rule, tuned for batch 16)",
                     "43 examples (3 replica(s) get 11, 1 get 10)", "16 step(s) per call, XLA off"):
        assert expected in text, expected


def test_plan_says_when_the_model_moved_into_the_scope():
    moved = "your Sequential, built outside the strategy's scope: its 12 variables ... nothing is re-created"
    assert f"model          {moved}" in Plan(**{**BASE, "placement": moved}).describe()
    assert "\n  model " not in Plan(**BASE).describe()  # built in the scope: nothing to say


def test_last_batch_wording():
    assert Plan(**{**BASE, "num_examples": 1024}).last_batch().startswith("none: 1024 examples fill 16 full batches")
    one = Plan(**{**BASE, "num_replicas": 1}).last_batch()
    assert one == "kept, not dropped or padded, in a step call of its own: 43 examples; weighted by its true size"
    assert "unevenly" in Plan(**{**BASE, "num_examples": None, "steps_per_epoch": None}).last_batch()
    tiny = Plan(**{**BASE, "num_examples": 1026}).last_batch()  # 2 examples left, 4 replicas
    assert "2 examples (fewer than the replicas: each of the 4 computes them all, counted once)" in tiny


def test_no_call_runs_the_uneven_last_step_with_full_ones():
    plan = Plan(**BASE)  # 1003 examples: 15 full steps, then step 15 of 43 examples
    assert [plan.steps_of_one_shape(step, 16) for step in (0, 8, 14, 15)] == [15, 7, 1, 16]
    assert Plan(**{**BASE, "num_examples": 1024}).steps_of_one_shape(0, 100) == 100
    assert Plan(**{**BASE, "num_examples": None}).steps_of_one_shape(3, 8) == 8


def test_no_scaling_and_warmup_wording():
    assert "0.1 -> 0.1 (no scaling)" in Plan(**{**BASE, "lr_rule": None, "scaled_lr": "0.1"}).describe()
    assert "linear warmup over 80 steps" in Plan(**{**BASE, "warmup_steps": 80}).describe()


def test_strategy_label_uses_the_guide_names():
    assert strategy_label(tf.distribute.get_strategy()) == "default (no distribution)"
    assert strategy_label(tf.distribute.OneDeviceStrategy("/cpu:0")) == "OneDeviceStrategy"


def test_plan_suggests_onednn_only_when_it_is_off_on_cpu():
    assert ONEDNN_HINT in Plan(**{**BASE, "onednn": False}).describe()
    assert "oneDNN" not in Plan(**{**BASE, "onednn": True}).describe()
    assert "oneDNN" not in Plan(**BASE).describe()  # accelerators, or TF does not say


def _row(text: str, name: str) -> str:
    return next(line.split(name, 1)[1].strip() for line in text.splitlines() if line.strip().startswith(name))


def test_plan_says_what_the_layers_compute_in():
    assert _row(Plan(**BASE).describe(), "precision") == "float32"
    bf16 = _row(Plan(**{**BASE, "precision": "mixed_bfloat16"}).describe(), "precision")
    assert bf16 == "mixed_bfloat16: layers compute in bfloat16, variables and losses stay float32"
    assert "dynamic loss scaling" in _row(Plan(**{**BASE, "precision": "mixed_float16"}).describe(), "precision")


def test_plan_suggests_bfloat16_only_in_float32_on_cpus_that_compute_it_natively():
    for unit in ("AMX", "AVX512_BF16"):
        assert _row(Plan(**{**BASE, "native_bf16": unit}).describe(), "precision") == f"float32; {bf16_hint(unit)}"
        assert f"natively ({unit})" in bf16_hint(unit)
        assert "natively" not in Plan(**{**BASE, "native_bf16": unit, "precision": "mixed_bfloat16"}).describe()
    assert "natively" not in Plan(**BASE).describe()
    assert not re.search(r"\d\.\d+x", bf16_hint("AMX") + ONEDNN_HINT)  # no lab figures in the plan
    with pytest.raises(ValueError, match="native_bf16=True"):
        Plan(**{**BASE, "native_bf16": True})


def test_plan_says_what_the_trainer_changed_in_the_process():
    assert "process" not in Plan(**BASE).describe()
    line = "glibc's mmap threshold raised to 32 MiB for this process"
    assert _row(Plan(**BASE, process=line).describe(), "process") == line


def test_plan_says_whose_step_runs_and_names_per_replica_batch_norm():
    text = Plan(**BASE, step="the model's own train_step, per replica", batch_norm=("bn_1",)).describe()
    assert "train step" in text and "the model's own train_step, per replica" in text
    assert "bn_1 normalize each replica's share by its own mean and variance" in text
    assert "Trainer(batch_norm='global'), the default," in text
    assert "batch norm" not in Plan(**{**BASE, "num_replicas": 1}, batch_norm=("bn_1",)).describe()


def test_plan_says_what_each_step_all_reduces_on_several_replicas():
    text = Plan(**BASE, gradient_values=25_557_032, gradient_bytes=102_228_128).describe()
    assert re.search(r"\n  all-reduce +102\.2 MB of gradients per step \(25,557,032 values\), summed over the 4 "
                     r"replicas", text), text
    assert "all-reduce" not in Plan(**{**BASE, "num_replicas": 1}, gradient_values=10, gradient_bytes=40).describe()
    assert "all-reduce" not in Plan(**BASE, gradient_values=10, gradient_bytes=40, repeated_data=True).describe()
    assert "1.2 KB of gradients" in Plan(**BASE, gradient_values=300, gradient_bytes=1200).describe()


def test_plan_says_batch_norm_takes_the_global_statistics_and_how_to_opt_out():
    text = Plan(**BASE, global_batch_norm=3).describe()
    assert re.search(r"\n  batch norm +3 BatchNormalization layer\(s\) normalize with the global batch's mean and "
                     r"variance, as on one device: 6 small all-reduces a step, one each way per layer, between the "
                     r"replicas ", text), text
    assert "Trainer(batch_norm='per_replica')" in text
    workers = Plan(**{**BASE, "num_workers": 2}, global_batch_norm=1).describe()
    assert "2 small all-reduces a step, one each way per layer, between the workers, each at the network's latency" \
           in workers, workers
    assert "batch norm" not in Plan(**{**BASE, "num_replicas": 1}, global_batch_norm=3).describe()


def test_plan_names_the_optimizer_options_that_act_on_the_global_gradient():
    import keras

    from trainer.engine.plan import optimizer_note

    assert optimizer_note(keras.optimizers.SGD(0.1), 2) is None
    assert optimizer_note(None, 2) is None  # a model whose own train_step needs no optimizer
    note = optimizer_note(keras.optimizers.Adam(global_clipnorm=1.0, gradient_accumulation_steps=4, use_ema=True,
                                                ema_momentum=0.9, ema_overwrite_frequency=100), 2)
    assert note == ("Adam: global_clipnorm=1 of the replicas' summed gradient; gradients accumulated over 4 steps; "
                    "EMA of the weights (momentum 0.9), written to the model every 100 steps; "
                    "the model holds the averages after fit")
    assert optimizer_note(keras.optimizers.SGD(clipvalue=0.5), 1) == "SGD: clipvalue=0.5"
    text = Plan(**BASE, optimizer=note).describe()
    assert "  optimizer" in text and note in text


@pytest.mark.slow
def test_fit_says_where_its_batch_and_execution_settings_came_from(capsys):
    """fit's batch_size wins over the Trainer's, the data's own batches are the global batch, and
    compile(steps_per_execution=..., jit_compile=...) fill in the Trainer's "auto"; the plan says which."""
    import keras
    import numpy as np

    from trainer import Trainer

    x, y = np.random.RandomState(0).rand(40, 3).astype("float32"), np.zeros((40, 1), "float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=3, jit_compile=True)
    trainer = Trainer(strategy="default", per_replica_batch_size=8, verbose=2)
    trainer.fit(model, x, y, batch_size=16)
    text = capsys.readouterr().out
    assert _row(text, "batch") == ("global 16 = 16 per replica x 1 "
                                   "(fit's batch_size=16; Trainer's per_replica_batch_size not used)")
    assert _row(text, "learning rate").startswith("0.01 -> 0.01")  # a batch the call fixed keeps its rate
    assert _row(text, "execution") == ("3 step(s) per call, XLA on (steps_per_execution=3 from the model's "
                                       "compile(); XLA from the model's compile(jit_compile=...))")
    trainer.fit(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(10))
    assert _row(capsys.readouterr().out, "batch") == "global 10 = 10 per replica x 1 (the batched dataset's batches)"


def test_plan_names_the_callbacks_every_worker_runs_unguarded_on_several_workers():
    import keras

    from trainer.callbacks import ChiefOnly, CSVLogger
    from trainer.engine.callback_hooks import unguarded

    class Reporter(keras.callbacks.Callback):
        pass

    callbacks = [keras.callbacks.EarlyStopping(), CSVLogger("log.csv"), ChiefOnly(Reporter()), Reporter()]
    assert unguarded(callbacks) == ("Reporter",)
    text = Plan(**{**BASE, "num_workers": 2, "unguarded": ("Reporter",)}).describe()
    assert re.search(r"\n  callbacks +Reporter run on each of the 2 workers.*ChiefOnly\(\.\.\.\) to run it on the "
                     r"chief alone", text), text
    assert "callbacks" not in Plan(**{**BASE, "unguarded": ("Reporter",)}).describe()  # one worker: no news


def test_fit_on_two_replicas_counts_the_gradients_it_all_reduces(capsys):
    import keras
    import numpy as np

    from conftest import mirrored
    from trainer import Trainer

    x, y = np.random.RandomState(0).rand(40, 3).astype("float32"), np.zeros((40, 1), "float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    Trainer(strategy=mirrored(2), batch_size=8, verbose=2).fit(model, x, y)
    # 3x5 + 5 + 5x1 + 1 = 26 float32 values
    assert _row(capsys.readouterr().out, "all-reduce") == ("104 bytes of gradients per step (26 values), summed "
                                                           "over the 2 replicas (docs/performance.md: where "
                                                           "scaling stops)")


def test_fit_says_why_xla_is_off_when_batch_norm_takes_the_global_statistics(capsys):
    import keras
    import numpy as np

    from conftest import mirrored
    from trainer import Trainer

    x, y = np.random.RandomState(0).rand(40, 3).astype("float32"), np.zeros((40, 1), "float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    trainer = Trainer(strategy=mirrored(2), batch_size=8, jit_compile=True, verbose=2)
    trainer.fit(model, x, y)
    assert _row(capsys.readouterr().out, "execution").endswith(
        "XLA off (XLA asked for, but the forward pass all-reduces across the replicas (BatchNormalization's "
        "global statistics, or the count of masked outputs), which a nested XLA function cannot do)")
    trainer.batch_norm = "per_replica"  # no all-reduce in the forward pass: XLA as asked, and nothing to explain
    trainer.fit(model, x, y)
    assert _row(capsys.readouterr().out, "execution").endswith("XLA on")
