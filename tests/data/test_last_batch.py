"""The uneven last batch on 1, 2 and 3 replicas: no crash, and the one-device numbers.

Model families of tf-keras's distribution-correctness tests (Embedding, GRU,
LSTM, a two-input siamese model, a Conv2D+MaxPool CNN, a CNN with synchronized
BatchNormalization), each fitted with steps_per_execution="auto" on a last
batch that shares a fused call with full steps and is split unevenly, and on a
last batch smaller than the replica count; from arrays and from datasets
(tests/scripts/last_batch_run.py). Each layout runs in its own process, with oneDNN's
CPU kernels on and off (their gradients of Conv2D and MaxPool abort on an
empty batch): every family on 2 and 3 replicas with them on, and on 3 with
them off; the CNN families, whose kernels they change, on 1 replica with them on
and off, and on 2 with them off too; every family on 3 replicas reading as GPUs
do. Each run is compared with the same run on one device.
"""

import concurrent.futures
import os

import numpy as np
import pytest

from conftest import FULL, run_python, SCRIPTS
from trainer.data import readers

pytestmark = pytest.mark.slow  # subprocesses, layouts or whole trainings: not in the everyday tier

FAMILIES = ["embedding", "gru", "lstm", "siamese", "cnn", "cnn_syncbn"]
CNNS = ["cnn", "cnn_syncbn"]  # oneDNN's kernels differ from TensorFlow's own in convolutions and pooling
# (layout, TF_ENABLE_ONEDNN_OPTS, families)
# One mirrored replica runs only the CNNs: the other families' mirrored path is the one 2 and 3 replicas run.
# "accelerator": mirrored, with the replicas reading as GPUs and TPUs do (TRAINER_ACCELERATOR_READER=1).
RUNS = [(("none", 1), "1", FAMILIES), (("mirrored", 1), "1", CNNS), (("mirrored", 2), "1", FAMILIES),
        (("mirrored", 3), "1", FAMILIES), (("none", 1), "0", FAMILIES), (("mirrored", 3), "0", FAMILIES),
        (("mirrored", 1), "0", CNNS), (("mirrored", 2), "0", CNNS), (("accelerator", 3), "1", FAMILIES)]
# CI's tier: 3 replicas (8 as 3+3+2, 5 as 2+2+1) and their references, every family with oneDNN off (TensorFlow's
# default on this AVX2 machine) and the CNNs with it on, where its kernels differ. The full tier
# (TRAINER_TESTS=full) runs every family with oneDNN on, and 1 and 2 replicas and the accelerator reader.
CI = [(("none", 1), "0", FAMILIES), (("mirrored", 3), "0", FAMILIES), (("none", 1), "1", CNNS),
      (("mirrored", 3), "1", CNNS)]
TIER = RUNS if FULL else CI


def _run(layout, onednn, families, path):
    name, devices = layout
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": onednn}
    if name == "accelerator":
        name, env[readers.ACCELERATOR_READER] = "mirrored", "1"
    printed = run_python(SCRIPTS / "last_batch_run.py", name, devices, path, ",".join(families), env=env, timeout=600)
    return printed, dict(np.load(path))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("last_batch")
    # Two at a time: most of each run is single-threaded tracing.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        futures = {run[:2]: pool.submit(_run, *run, folder / f"{run[0][0]}{run[0][1]}_{run[1]}.npz")
                   for run in TIER}
        return {run: future.result() for run, future in futures.items()}


@pytest.mark.parametrize("run", [pytest.param(run, marks=() if run in TIER else pytest.mark.full)
                                 for run in TIER + [run for run in RUNS if run not in TIER] if run[0][0] != "none"],
                         ids=lambda run: f"{run[0][1]}replicas-onednn{run[1]}-{len(run[2])}families"
                         + ("-accelerator" if run[0][0] == "accelerator" else ""))
def test_uneven_last_batches_give_the_one_device_numbers(runs, run):
    layout, onednn, families = run
    result, arrays = runs[run[:2]]
    reference, reference_arrays = runs[(("none", 1), onednn)]
    assert result["replicas"] == layout[1]
    keys = [f"{family}/{case}/{form}" for family in families for case in ("fused", "tiny")
            for form in ("arrays", "dataset")]
    assert sorted(result["results"]) == sorted(keys)
    for key in keys:
        ours, theirs = result["results"][key], reference["results"][key]
        assert ours["history"].keys() == theirs["history"].keys(), key
        for name, values in theirs["history"].items():
            np.testing.assert_allclose(ours["history"][name], values, rtol=1e-5, err_msg=f"{key} {name}")
        for name, value in theirs["evaluate"].items():
            np.testing.assert_allclose(ours["evaluate"][name], value, rtol=1e-5, err_msg=f"{key} {name}")
        np.testing.assert_allclose(arrays[f"{key}/weights"], reference_arrays[f"{key}/weights"],
                                   rtol=1e-5, atol=1e-6, err_msg=key)
        # Outputs are compared on their own scale: a logit of 15 carries float32 rounding of about 1e-6 of
        # it into every output (seen: 1.8e-5 on a -0.013 output of the synchronized-BN CNN, oneDNN on AVX-512).
        expected = reference_arrays[f"{key}/predictions"]
        np.testing.assert_allclose(arrays[f"{key}/predictions"], expected, rtol=1e-5,
                                   atol=1e-5 * max(1.0, float(np.abs(expected).max())), err_msg=key)


@pytest.mark.parametrize("onednn", ["1", "0"])
def test_one_device_reference_is_keras_fit_and_it_trained(runs, onednn):
    result, arrays = runs[(("none", 1), onednn)]
    for family in next(families for layout, on, families in TIER if layout == ("none", 1) and on == onednn):
        ours, keras_run = result["results"][f"{family}/fused/dataset"], result["results"][f"{family}/keras"]
        for name, values in keras_run["history"].items():
            np.testing.assert_allclose(ours["history"][name], values, rtol=1e-5, err_msg=f"{family} {name}")
        np.testing.assert_allclose(arrays[f"{family}/fused/dataset/weights"], arrays[f"{family}/keras/weights"],
                                   rtol=1e-5, atol=1e-6, err_msg=family)
        assert ours["history"]["loss"][1] < ours["history"]["loss"][0], family  # the steps moved the weights
