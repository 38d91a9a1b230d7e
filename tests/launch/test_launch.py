"""trainer-launch without TensorFlow in the tasks: cluster specs, prefixes, failures, Ctrl-C."""

import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ended, run_script, script_failed, sigint_as_in_a_terminal, start_script

from trainer.launch import job, supervise


def test_cluster_spec_and_tf_config():
    assert job.cluster_spec(2, 0, [1, 2]) == {"worker": ["localhost:1", "localhost:2"]}
    cluster = job.cluster_spec(2, 1, [1, 2, 3, 4])
    assert cluster == {"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"], "ps": ["localhost:4"]}
    assert job.tasks(cluster) == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    assert json.loads(supervise.tf_config(cluster, "worker", 1))["task"] == {"type": "worker", "index": 1}
    ports = job.free_ports(3)
    assert len(set(ports)) == 3


def _script(tmp_path, body):
    path = tmp_path / "task.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _launch(script, *args, workers=2, ps=0, options=(), env=None, cwd=None):
    # -X faulthandler: a launcher that hangs can be made to print every thread's stack (see _output)
    return start_script(script, *args, launch=("--workers", workers, "--ps", ps, *options), env=env, cwd=cwd,
                        python=("-X", "faulthandler"))


def _output(proc, timeout=30):
    """The launcher once it exits (`ended`); a launcher still running after `timeout` fails the test with
    its threads' stacks (SIGABRT makes faulthandler print them)."""
    try:
        return ended(proc, timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        pytest.fail(f"trainer.launch still ran {timeout}s on; its output, then its threads' stacks:\n"
                    f"{script_failed(ended(proc, 30))}")


def _gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_each_task_gets_its_tf_config_and_a_prefix(tmp_path):
    script = _script(tmp_path, """
        import json, os, sys
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        print("hello from", task["type"], task["index"], "args", sys.argv[1:])
    """)
    launcher = _output(_launch(script, "--flag", "1", workers=3), timeout=60)
    for i in range(3):
        assert f"[worker:{i}] hello from worker {i} args ['--flag', '1']" in launcher.stdout, script_failed(launcher)


def test_a_failing_task_stops_the_others_with_its_status(tmp_path):
    script = _script(tmp_path, """
        import json, os, sys, time
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
            sys.exit(3)
        time.sleep(60)
    """)
    start = time.monotonic()
    launcher = _output(_launch(script), timeout=60)
    assert launcher.returncode == 3, script_failed(launcher)
    assert "task worker:1 failed with exit status 3" in launcher.stdout
    assert time.monotonic() - start < 30


def test_a_task_stopped_by_sigterm_from_outside_is_said_to_be_stopped_not_failed(tmp_path):
    script = _script(tmp_path, """
        import json, os, signal, time
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # as a preempted node's own processes get it
        time.sleep(60)
    """)
    launcher = _output(_launch(script), timeout=60)
    assert launcher.returncode == 143, script_failed(launcher)
    assert "[launcher] task worker:1 was stopped by SIGTERM (exit status 143); stopping the others" in launcher.stdout
    assert "failed" not in launcher.stdout


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_interrupt_stops_every_task(tmp_path, signum, status):
    marker = tmp_path / "pids"
    script = _script(tmp_path, f"""
        import os, signal, sys, time

        def stop(signum, frame):  # as BackupAndRestore does: save, say so, exit
            print("saved and stopped", flush=True)
            sys.exit(143)

        signal.signal(signal.SIGTERM, stop)
        with open({str(marker)!r}, "a") as f:
            f.write(f"{{os.getpid()}}\\n")
        time.sleep(60)
    """)
    with sigint_as_in_a_terminal():
        proc = _launch(script)
    deadline = time.monotonic() + 30
    while (not marker.exists() or len(marker.read_text().split()) < 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signum)
    try:
        launcher = _output(proc)
    finally:
        pids = [int(pid) for pid in marker.read_text().split()]
        survivors = [pid for pid in pids if not _gone(pid)]
        for pid in survivors:  # leave no task behind, even when the test fails
            os.kill(pid, signal.SIGKILL)
    assert launcher.returncode == status and "interrupted" in launcher.stdout, script_failed(launcher)
    assert len(pids) == 2 and not survivors
    assert ("[worker:0] saved and stopped" in launcher.stdout
            and "[worker:1] saved and stopped" in launcher.stdout), script_failed(launcher)


@pytest.mark.parametrize("ignored", [False, True], ids=["default", "ignored"])
def test_run_stops_on_sigint_unless_the_parent_ignores_it(tmp_path, ignored):
    """In-process: the task sends Ctrl-C to the launcher itself, then waits to be stopped (or exits). A
    launcher started with SIGINT ignored (a background job of a script) keeps ignoring it, as Python does.
    The launcher's handlers are put back afterwards."""
    script = _script(tmp_path, """
        import os, signal, sys, time
        os.kill(os.getppid(), signal.SIGINT)
        time.sleep(60 if sys.argv[1] == "wait" else 0)
    """)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN if ignored else signal.default_int_handler)
    sigterm = signal.getsignal(signal.SIGTERM)
    out = io.StringIO()
    try:
        start = time.monotonic()
        status = job.run([sys.executable, script, "exit" if ignored else "wait"], workers=1, out=out)
        assert signal.getsignal(signal.SIGINT) is (signal.SIG_IGN if ignored else signal.default_int_handler)
        assert signal.getsignal(signal.SIGTERM) is sigterm
    finally:
        signal.signal(signal.SIGINT, before)
    assert (status, "interrupted" in out.getvalue()) == ((0, False) if ignored else (130, True))
    assert time.monotonic() - start < 30


def test_a_task_that_cannot_start_stops_those_that_did(tmp_path):
    marker = tmp_path / "pid"
    script = _script(tmp_path, f"""
        import os, time
        with open({str(marker)!r} + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace({str(marker)!r} + ".tmp", {str(marker)!r})
        time.sleep(60)
    """)

    def missing_server(kind, index):  # once the chief runs, a worker whose program does not exist
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return [str(tmp_path / "no-such-program")]

    with pytest.raises(FileNotFoundError, match="no-such-program"):
        job.run([sys.executable, script], workers=1, ps=1, out=io.StringIO(), server_command=missing_server)
    assert _gone(int(marker.read_text()))


RESTARTING = """
    import json, os, sys
    config = json.loads(os.environ["TF_CONFIG"])
    with open(os.path.join(os.path.dirname(__file__), "starts"), "a") as f:
        f.write(config["task"]["type"] + str(config["task"]["index"]) + " " + os.environ["TRAINER_LAUNCH"] + "\\n")
    print("backup dir", os.environ.get("TRAINER_BACKUP_DIR"), flush=True)
    launch = os.environ["TRAINER_LAUNCH"]
    restart = int(launch.split("restart ")[1].split(" ")[0]) if "restart " in launch else 0
    if config["task"]["index"] == 1 and restart < int(sys.argv[1]):  # worker 1 fails its first starts
        sys.exit(3)
"""


def _starts(tmp_path):
    return (tmp_path / "starts").read_text().splitlines()


def test_max_restarts_starts_every_task_again_after_one_fails(tmp_path):
    script = _script(tmp_path, RESTARTING)
    launcher = _output(_launch(script, "1", options=("--max-restarts", "2"), cwd=tmp_path))
    assert launcher.returncode == 0, script_failed(launcher)
    out = launcher.stdout
    assert out.count("[launcher] restart 1 of 2: task worker:1 failed with exit status 3; starting again") == 1
    assert "restart 2 of 2" not in out
    starts = sorted(_starts(tmp_path))
    here = "trainer-launch on this machine"
    assert starts == [f"worker0 {here}", f"worker0 {here}, restart 1 of 2", f"worker1 {here}",
                      f"worker1 {here}, restart 1 of 2"]
    backup = str(tmp_path / "trainer-backup")
    assert f"[launcher] backups in {backup} (TRAINER_BACKUP_DIR)" in out and f"backup dir {backup}" in out


def test_restarts_used_up_end_with_the_failures_status_and_reason(tmp_path):
    script = _script(tmp_path, RESTARTING)
    launcher = _output(_launch(script, "9", options=("--max-restarts", "2"), cwd=tmp_path,
                               env={"TRAINER_BACKUP_DIR": str(tmp_path / "mine")}))
    assert launcher.returncode == 3, script_failed(launcher)
    out = launcher.stdout
    assert "[launcher] restart 2 of 2: task worker:1 failed with exit status 3; starting again" in out
    assert ("[launcher] no restart left (2 of 2 used): task worker:1 failed with exit status 3; exiting with "
            "status 3") in out
    assert len([s for s in _starts(tmp_path) if s.startswith("worker1")]) == 3  # the first start and 2 restarts
    assert "backups in" not in out and f"backup dir {tmp_path / 'mine'}" in out  # the folder it was given


def test_without_restarts_a_failure_ends_the_job_and_no_backup_is_given(tmp_path):
    script = _script(tmp_path, RESTARTING)
    launcher = _output(_launch(script, "1", cwd=tmp_path, env={"TRAINER_BACKUP_DIR": None}))
    out = launcher.stdout
    assert launcher.returncode == 3 and "restart" not in out and "backup dir None" in out, script_failed(launcher)


def test_missing_script_is_a_usage_error():
    proc = run_script(None, launch=("--workers", "2"), check=False)
    assert proc.returncode == 2 and "the script to run is missing" in proc.stderr, script_failed(proc)


@pytest.mark.parametrize("tf_config, received", [
    (None, "task type None in a cluster with 0 ps task(s)"),
    ({"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]},
      "task": {"type": "chief", "index": 0}}, "task type 'chief' in a cluster with 1 ps task(s)"),
    ({"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 1}},
     "task type 'worker' in a cluster with 0 ps task(s)"),  # a multi-worker job: every task runs the script
])
def test_serve_needs_a_worker_or_ps_task_of_a_ps_cluster(tf_config, received):
    env = {"TF_CONFIG": json.dumps(tf_config) if tf_config else None}
    out = run_script(None, launch=("--serve",), env=env, timeout=60, check=False)
    assert out.returncode == 2, script_failed(out)
    assert "TF_CONFIG must name one" in out.stderr and received in out.stderr, script_failed(out)


def test_serve_takes_no_script():
    out = run_script("train.py", launch=("--serve",), timeout=60, check=False)
    assert out.returncode == 2 and "--serve takes no script" in out.stderr and "'train.py'" in out.stderr, \
        script_failed(out)


@pytest.mark.slow
def test_notebook_launcher_returns_the_chiefs_result(tmp_path):
    script = _script(tmp_path, """
        from trainer import notebook_launcher

        def train():
            from trainer import Trainer  # everything TensorFlow happens inside the workers
            trainer = Trainer(strategy="multi_worker", batch_size=32, verbose=0)
            import numpy as np, keras
            x = np.random.default_rng(0).normal(size=(100, 4)).astype("float32")
            y = (x[:, 0] > 0).astype("int64")
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
            model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            history = trainer.fit(model, (x, y), epochs=1)
            from trainer import cluster_info
            return cluster_info().task_id, history.history["loss"][0]

        print("RESULT", notebook_launcher(train, workers=2, timeout=120))
    """)
    proc = run_script(script, timeout=180)
    line = next(out_line for out_line in proc.stdout.splitlines() if out_line.startswith("RESULT"))
    task_id, loss = eval(line[len("RESULT "):])
    assert task_id == 0 and 0 < loss < 5


def test_notebook_launcher_reports_a_result_it_cannot_return(tmp_path):
    script = _script(tmp_path, """
        from trainer import notebook_launcher
        try:
            notebook_launcher(lambda: (lambda: 1), workers=2, timeout=60)
        except RuntimeError as err:
            print("RAISED", "pickle" in str(err).lower())
    """)
    proc = run_script(script, timeout=120, check=False)
    assert "RAISED True" in proc.stdout, proc.stderr[-2000:]


def test_task_ports_can_be_fixed_for_a_firewall(tmp_path):
    script = _script(tmp_path, """
        import json, os
        print("ports", [a.rsplit(":", 1)[1] for a in json.loads(os.environ["TF_CONFIG"])["cluster"]["worker"]])
    """)
    base = job.free_ports(1)[0]  # free a moment ago, and most likely its neighbour too
    done = _output(_launch(script, options=("--task-port-base", base)))
    assert done.returncode == 0, done.stdout
    assert f"ports ['{base}', '{base + 1}']" in done.stdout
    # the same from the environment
    done = _output(_launch(script, env={**os.environ, job.PORT_BASE_ENV: str(base)}))
    assert done.returncode == 0 and f"ports ['{base}', '{base + 1}']" in done.stdout, done.stdout


def test_a_fixed_task_port_that_is_taken_is_a_usage_error(tmp_path):
    script = _script(tmp_path, "print('started')\n")
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _output(_launch(script, options=("--task-port-base", port)))
    assert done.returncode == 2 and "started" not in done.stdout
    assert f"port {port} is taken" in done.stdout and "Pass another --task-port-base" in done.stdout
    bad = _output(_launch(script, env={**os.environ, job.PORT_BASE_ENV: "80"}))
    assert bad.returncode == 2 and "TRAINER_TASK_PORT_BASE must be a port from 1024" in bad.stdout
