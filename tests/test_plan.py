"""The plan printed at the start of fit."""

import tensorflow as tf

from trainer import Plan
from trainer.plan import ONEDNN_HINT, strategy_label

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


def test_last_batch_wording():
    assert Plan(**{**BASE, "num_examples": 1024}).last_batch().startswith("none: 1024 examples fill 16 full batches")
    one = Plan(**{**BASE, "num_replicas": 1}).last_batch()
    assert one == "kept, not dropped or padded: 43 examples; weighted by its true size"
    assert "unevenly" in Plan(**{**BASE, "num_examples": None, "steps_per_epoch": None}).last_batch()


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

