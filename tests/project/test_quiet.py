"""trainer/quiet.py: TensorFlow's start-up notices stay off the screen; every other line of stderr passes."""

import os
import subprocess
import sys

import pytest

from trainer.quiet import NoticeFilter, is_startup_notice

# As TensorFlow 2.21 (absl's format) and 2.18 (its own) print them on a CPU machine, and a cluster's start.
NOTICES = [
    "I0000 00:00:1795638182.327043   29734 coordination_service.cc:221] Initializing CoordinationService",
    "I0000 00:00:1795638182.303833   29735 grpc_server_lib.cc:467] Started server with target: grpc://vm:12497",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795636001.471757   31607 port.cc:153] oneDNN custom operations are on. You may see slightly "
    "different numerical results due to floating-point round-off errors from different computation orders.",
    "I0000 00:00:1795636001.472402   31607 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU "
    "will not be used.",
    "E0000 00:00:1795636002.074173   31607 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)",
    "I0000 00:00:1795635545.272438   19132 cpu_feature_guard.cc:227] This TensorFlow binary is optimized to use "
    "available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other operations, rebuild "
    "TensorFlow with the appropriate compiler flags.",
    "2026-11-25 17:56:48.268968: E external/local_xla/xla/stream_executor/cuda/cuda_fft.cc:477] Unable to register "
    "cuFFT factory: Attempting to register factory for plugin cuFFT when one has already been registered",
    "2026-11-25 17:47:54.712314: I tensorflow/core/platform/cpu_feature_guard.cc:210] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "I0000 00:00:1795637857.848605   25565 generator_dataset_op.cc:213] Memory patch applied: M_TRIM_THRESHOLD=128 "
    "kb was set.",
]
# Lines that say something about the job: they pass.
NEWS = [
    "W0000 00:00:1795636002.074173   31607 collective_ops.cc:12] a collective failed: peer unavailable",
    "E0000 00:00:1795636002.074173   31607 coordination_service_agent.cc:52] task /job:worker/replica:0/task:1 died",
    "2026-11-25 17:56:48.268968: W tensorflow/core/framework/op_kernel.cc:1840] OP_REQUIRES failed: OOM",
    "Traceback (most recent call last):",
    "UserWarning: Per-replica BatchNormalization: batch_normalization normalize each replica's share",
    "  File \"/work/main/trainer/placement.py\", line 171, in _move_variables",
    "E0000 00:00:1795637857.848605   25565 generator_dataset_op.cc:107] Error occurred when finalizing "
    "GeneratorDataset iterator: FAILED_PRECONDITION",
    "2026-11-25 17:56:48.268968: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:1120] failed to "
    "allocate 1.20G (1288490240 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY: out of memory",
]


@pytest.mark.parametrize("line", NOTICES)
def test_tensorflows_start_up_notices_are_recognised(line):
    assert is_startup_notice(line)


@pytest.mark.parametrize("line", NEWS)
def test_warnings_errors_and_tracebacks_pass(line):
    assert not is_startup_notice(line)


CHILD = """
import os, sys
from trainer.quiet import startup_notices_hidden
with startup_notices_hidden():
    import tensorflow as tf
    tf.config.list_logical_devices()  # TensorFlow finds its devices: the CUDA notices, where there are any
    os.write(2, b"E0000 00:00:1.0   1 coordination_service_agent.cc:52] a real error\\n")
    print("a Python warning", file=sys.stderr)
os.write(2, b"after the block\\n")
"""


@pytest.mark.slow
@pytest.mark.parametrize("user_level", [None, "0"])
def test_a_process_that_imports_tensorflow_inside_shows_only_the_news(user_level):
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    if user_level is not None:
        env["TF_CPP_MIN_LOG_LEVEL"] = user_level
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert "E0000 00:00:1.0   1 coordination_service_agent.cc:52] a real error" in lines
    assert "a Python warning" in lines and lines[-1] == "after the block"
    notices = [line for line in lines if is_startup_notice(line)]
    if user_level is None:
        assert notices == []
    else:  # the user's TF_CPP_MIN_LOG_LEVEL: TensorFlow's logs are shown as they chose
        assert notices, proc.stderr


def test_the_task_list_of_a_dropped_notice_goes_with_it_and_nothing_else():
    notices = NoticeFilter()
    lines = ["I0000 00:00:1.0   1 coordination_service.cc:505] Example stragglers:", "/job:worker/replica:0/task:1",
             "Training plan", "/job:worker/replica:0/task:1"]
    assert [line for line in lines if notices.passes(line)] == ["Training plan", "/job:worker/replica:0/task:1"]


def test_the_source_trace_tensorflow_2_22_prints_after_a_dropped_notice_goes_with_it():
    notices = NoticeFilter()
    lines = ["E0000 00:00:1.0   1 cuda_platform.cc:57] failed call to cuInit: INTERNAL: CUDA error: Failed call to "
             "cuInit: UNKNOWN ERROR (303)", "=== Source Location Trace: === ",
             "external/xla/xla/stream_executor/cuda/cuda_status.cc:50", "", "Training plan", "",
             "external/xla/xla/stream_executor/cuda/cuda_status.cc:50"]
    assert [line for line in lines if notices.passes(line)] == lines[4:]
