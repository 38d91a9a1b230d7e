"""Strategy names and TF_CONFIG parsing."""

import json

import numpy as np
import pytest
import tensorflow as tf

from conftest import run_code, run_python, SCRIPTS
from trainer import STRATEGY_NAMES, parse_tf_config, resolve_strategy
from trainer.distribute.strategy import auto_strategy_name, check_strategy_name

CLUSTER = {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"]}


def test_no_tf_config_is_a_single_chief():
    info = parse_tf_config(None)
    assert info.is_chief and info.num_workers == 1 and info.num_ps == 0


def test_chief_and_workers():
    chief = parse_tf_config(json.dumps({"cluster": CLUSTER, "task": {"type": "chief", "index": 0}}))
    worker0 = parse_tf_config({"cluster": CLUSTER, "task": {"type": "worker", "index": 0}})
    assert chief.num_workers == 3 and chief.is_chief
    assert not worker0.is_chief  # a dedicated chief exists


def test_worker_zero_is_chief_without_a_chief_task():
    cluster = {"worker": ["localhost:2", "localhost:3"]}
    assert parse_tf_config({"cluster": cluster, "task": {"type": "worker", "index": 0}}).is_chief
    assert not parse_tf_config({"cluster": cluster, "task": {"type": "worker", "index": 1}}).is_chief


def test_parameter_server_cluster():
    cluster = {"chief": ["h:1"], "worker": ["h:2"], "ps": ["h:3"]}
    info = parse_tf_config({"cluster": cluster, "task": {"type": "ps", "index": 0}})
    assert info.num_ps == 1 and not info.is_chief


@pytest.mark.parametrize("info, gpus, tpu, expected", [
    ({}, 0, False, "default"),
    ({}, 1, False, "default"),
    ({}, 4, False, "mirrored"),
    ({"cluster": CLUSTER, "task": {"type": "chief"}}, 4, False, "multi_worker"),
    ({"cluster": {**CLUSTER, "ps": ["h:9"]}, "task": {"type": "chief"}}, 0, False, "parameter_server"),
    ({"cluster": CLUSTER, "task": {"type": "chief"}}, 4, True, "tpu"),
])
def test_auto_picks_tpu_then_cluster_then_gpus(info, gpus, tpu, expected):
    assert auto_strategy_name(parse_tf_config(info), gpus, tpu) == expected


def test_names_resolve_to_strategies():
    assert isinstance(resolve_strategy("mirrored"), tf.distribute.MirroredStrategy)
    assert resolve_strategy("mirrored").num_replicas_in_sync == 4  # the 4 logical CPUs from conftest
    assert isinstance(resolve_strategy("one_device"), tf.distribute.OneDeviceStrategy)
    assert resolve_strategy("default") is tf.distribute.get_strategy()
    assert resolve_strategy("auto") is tf.distribute.get_strategy()  # no GPU here: as model.fit runs
    assert set(STRATEGY_NAMES) >= {"auto", "default", "mirrored", "multi_worker", "parameter_server", "tpu"}


def test_parameter_server_needs_a_ps_task(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match=r"needs a cluster with at least one 'ps' task"):
        resolve_strategy("parameter_server")


def test_bad_names():
    with pytest.raises(ValueError, match=r"`strategy` must be one of .*'Mirrored'. Did you mean 'mirrored'\?"):
        check_strategy_name("Mirrored")
    with pytest.raises(TypeError, match="must be a tf.distribute.Strategy or a name"):
        check_strategy_name(["mirrored"])


def test_mirrored_options_subset_and_cross_device_ops():
    strategy = resolve_strategy("mirrored", devices=["/cpu:1", "/cpu:3"], cross_device_ops="reduction_to_one_device")
    assert strategy.num_replicas_in_sync == 2
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)
    from trainer.distribute.strategy import _CROSS_DEVICE_OPS

    assert _CROSS_DEVICE_OPS["nccl"] is tf.distribute.NcclAllReduce
    assert _CROSS_DEVICE_OPS["hierarchical_copy"] is tf.distribute.HierarchicalCopyAllReduce


def test_bad_strategy_options():
    with pytest.raises(TypeError, match=r"'mirrored' takes no option\(s\) \['timeout'\].*devices"):
        resolve_strategy("mirrored", timeout=3)
    with pytest.raises(ValueError, match=r"Unknown `cross_device_ops`.*'allreduce'"):
        resolve_strategy("mirrored", cross_device_ops="allreduce")


@pytest.mark.slow
def test_repeated_fits_under_mirrored_strategies_of_different_sizes():
    result = run_python(SCRIPTS / "repeated_fit_run.py")
    losses = result["losses"]
    assert set(losses) == {"1", "2", "4", "4 again, by name in fit", "2 again", "user 2", "user 2 after the refusal"}
    for name, values in losses.items():  # every run finished, with the single-device numbers
        np.testing.assert_allclose(values, losses["1"], rtol=1e-5, err_msg=name)
    assert result["error"].startswith("`strategy` must not reuse the collective group keys of another "
                                      "MirroredStrategy of this process. Received: strategy=MirroredStrategy over 4 "
                                      "device(s), group key 1, which a strategy over 2 device(s) already used")
    assert "resolve_strategy('mirrored', devices=[...]) (`from trainer import resolve_strategy`" in result["error"]


def test_a_collective_error_names_the_peer_task_and_its_address():
    from trainer.distribute.cluster import ClusterInfo
    from trainer.distribute.faults import failed_peer

    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["a:1", "b:2", "c:3"]}), task_type="worker", task_id=0)
    strategy = type("Strategy", (), {"cluster_resolver": resolver})()
    me = ClusterInfo(task_type="worker", task_id=0, num_workers=3)
    broken_call = ("Collective ops is aborted by: recvmsg:Connection reset by peer\nAdditional GRPC error information "
                   "from remote target /job:worker/replica:0/task:2 while calling /tensorflow.WorkerService/RecvBuf")
    assert failed_peer(broken_call, strategy, me) == "worker 2 (c:3)"
    health_check = "cluster check alive failed, /job:worker/replica:0/task:1 is down"
    assert failed_peer(health_check, strategy, me) == "worker 1 (b:2)"
    own_device = "Detected at /job:worker/replica:0/task:0/device:CPU:0: deadline exceeded"
    assert failed_peer(own_device, strategy, me) == "a peer task"
    assert failed_peer("deadline exceeded", tf.distribute.get_strategy(), ClusterInfo()) == "a peer task"


@pytest.mark.slow
def test_a_process_has_one_multi_worker_strategy_shared_by_every_trainer():
    """TensorFlow runs one MultiWorkerMirroredStrategy per process: the trainer makes it once, every Trainer and
    `resolve_strategy` call without options takes it, and other options are refused, naming both."""
    code = """
from trainer import Trainer, resolve_strategy
first = resolve_strategy("multi_worker", communication="ring")
assert resolve_strategy("multi_worker", communication="ring") is first
assert resolve_strategy("multi_worker") is first  # no options: the one running, as it is
assert Trainer(strategy="multi_worker", verbose=0)._call_strategy(None) is first
try:
    resolve_strategy("multi_worker", communication="nccl")
except ValueError as err:
    print(err)
"""
    proc = run_code(code, timeout=120)
    assert ("This process runs a MultiWorkerMirroredStrategy already, and TensorFlow runs one per process. "
            "Received: communication='nccl'") in proc.stdout
    assert "where the one running has communication='ring'" in proc.stdout
