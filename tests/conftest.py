"""Shared test set-up.

The pytest process gets 4 logical CPU devices, so in-process tests can build
MirroredStrategy over 1, 2 or 4 replicas. Strategies of different sizes share
collective group keys in one process, so in-process multi-replica tests use
`cross_device_ops=ReductionToOneDevice()`; tests that need the default
cross-device ops run one subprocess per device layout (see `run_python`).
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 4
)

import keras  # noqa: E402

TESTS = Path(__file__).parent
SCRIPTS = TESTS / "scripts"  # run in processes of their own (`run_script`, `run_python`)
sys.path.insert(0, str(TESTS / "helpers"))  # what tests and scripts share: the tiny problem, the model families

from tiny import tiny_data, tiny_model  # noqa: E402,F401  (re-exported for tests)

# Two tiers. The default (`make test`, what CI runs) runs every check on the layouts that carry it; the full
# tier (TRAINER_TESTS=full, `make test-full`) repeats checks on more replica counts, workers, oneDNN settings
# and scale layouts. A test or parameter only the full tier runs carries the `full` marker.
FULL = os.environ.get("TRAINER_TESTS") == "full"
# Keras's own tests and their helpers: tests/keras/test_keras_suite.py runs them in processes of their own.
collect_ignore = ["keras_suite"]


# The longest files, longest first: pytest-xdist hands out whole files in collection order with `--dist loadfile
# --no-loadscope-reorder` (by default it starts with the files of most tests), and one of these started last
# would run on alone at the end: 8 minutes for Keras's tests.
LONGEST = ["test_keras_suite.py", "test_keras_parity.py", "test_keras_hub.py", "test_last_batch.py",
           "test_multiworker.py", "test_backup.py", "test_ecosystem.py", "test_parameter_server.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST)))  # stable: the rest keep their order
    if FULL:
        return
    skip = pytest.mark.skip(reason="the full tier's: TRAINER_TESTS=full (make test-full) runs it")
    for item in items:
        if "full" in item.keywords:
            item.add_marker(skip)


def mirrored(num_replicas: int) -> tf.distribute.MirroredStrategy:
    """A MirroredStrategy over the first `num_replicas` logical CPUs, safe in-process."""
    return tf.distribute.MirroredStrategy(
        [f"/cpu:{i}" for i in range(num_replicas)],
        cross_device_ops=tf.distribute.ReductionToOneDevice(),
    )


def as_worker(callback):
    """Makes `callback` see itself on worker 1 of 2 (not the chief) under Trainer.fit."""
    from trainer import ClusterInfo

    original = callback.set_trainer_context

    def set_context(context):
        context.cluster = ClusterInfo(task_type="worker", task_id=1, num_workers=2)
        original(context)

    callback.set_trainer_context = set_context
    return callback


def assert_same_run(result: dict, arrays: dict, reference: tuple) -> None:
    """A layout's run (JSON result, saved arrays) equals the reference run: history, evaluate, weights, predictions."""
    ref_result, ref_arrays = reference
    for key, values in ref_result["history"].items():
        np.testing.assert_allclose(result["history"][key], values, rtol=1e-5, err_msg=key)
    for key, value in ref_result["evaluate"].items():
        np.testing.assert_allclose(result["evaluate"][key], value, rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(arrays["weights"], ref_arrays["weights"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(arrays["predictions"], ref_arrays["predictions"], rtol=1e-5, atol=1e-6)


def run_script(script, *args, launch: tuple = (), env: dict | None = None, timeout: int = 300, cwd=None,
               check: bool = True) -> subprocess.CompletedProcess:
    """Runs a test script (tests/scripts/) in a fresh interpreter, with `env` added to the environment (a None
    value unsets a variable), under `trainer-launch` with the `launch` flags if given (e.g. ("--workers", "2");
    with `script` None, the launcher alone: its usage errors, `--serve`). With `check`, a script that did not
    exit 0 fails the test with the tail of its output (`script_failed`). Returns the process."""
    return _python(_arguments(script, args, launch), env, timeout, cwd, check)


def start_script(script, *args, launch: tuple = (), env: dict | None = None, cwd=None,
                 python: tuple = ()) -> subprocess.Popen:
    """`run_script`'s process, started and not waited for: for a test that signals it, or runs several side by
    side (a job's nodes, a cluster's tasks). `python` are the interpreter's own options (e.g. ("-X",
    "faulthandler")). Its errors come in its output, in order with the rest; `ended` waits for it."""
    return subprocess.Popen([sys.executable, *python, *_arguments(script, args, launch)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=cwd, env=_environment(env))


def ended(proc: subprocess.Popen, timeout: float | None = None) -> subprocess.CompletedProcess:
    """A process of `start_script` once it has exited, as `run_script` returns one (its output in `stdout`),
    for the test's checks and `script_failed`.

    Raises:
      subprocess.TimeoutExpired: it still runs after `timeout` seconds; it is left running, for the test to
        stop as it must (a signal, a kill).
    """
    out, _ = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


@contextlib.contextmanager
def sigint_as_in_a_terminal():
    """Processes started inside (`start_script`) get SIGINT's default action, as a command typed at a terminal
    does. Where the test run itself ignores SIGINT (a job started in the background without job control, as
    CI may start it), its children inherit that, and the launcher rightly keeps ignoring Ctrl-C."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # exec turns a handler into SIG_DFL
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_code(code: str, *, env: dict | None = None, timeout: int = 300, cwd=None,
             check: bool = True) -> subprocess.CompletedProcess:
    """`python -c code` in a fresh interpreter, as `run_script` runs a script."""
    return _python(["-c", code], env, timeout, cwd, check)


def _arguments(script, args: tuple, launch: tuple) -> list[str]:
    launcher = ["-m", "trainer.launch", *map(str, launch)] if launch else []
    return [*launcher, *([] if script is None else [str(script)]), *map(str, args)]


def _environment(env: dict | None) -> dict:
    """This process's environment, TensorFlow's C++ logs held to errors, and `env` on top (None: unset)."""
    merged = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}
    return {name: value for name, value in merged.items() if value is not None}


def _python(arguments: list, env: dict | None, timeout: int, cwd, check: bool) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *arguments], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=_environment(env))
    if check:
        assert proc.returncode == 0, script_failed(proc)
    return proc


def script_failed(*procs: subprocess.CompletedProcess) -> str:
    """How a test reports scripts that went otherwise than it expected: each one's command, exit status and
    output."""
    return "\n".join(f"{' '.join(str(part) for part in proc.args)} exited {proc.returncode}:\n"
                     f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}" for proc in procs)


def load_run(out, task: str) -> tuple[dict, dict]:
    """What a run script's `task` saved in `out`: its JSON results, and its arrays (OUT/<task>.json, .npz)."""
    with open(out / f"{task}.json") as f:
        results = json.load(f)
    return results, dict(np.load(out / f"{task}.npz"))


def run_python(script, *args, env: dict | None = None, timeout: int = 300, launch: tuple = ()) -> dict:
    """`run_script`, then the JSON the script printed last."""
    proc = run_script(script, *args, env=env, timeout=timeout, launch=launch)
    return json.loads(proc.stdout.strip().splitlines()[-1])


class LearningRateSeen(keras.callbacks.Callback):
    """Records the learning rate in effect at each epoch's end (history has Keras's keys only)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


@pytest.fixture
def data():
    return tiny_data()
