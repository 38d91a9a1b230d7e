"""trainer-launch over several machines, played by launchers on localhost: the rendezvous, failures, Ctrl-C.

The tasks here are plain Python scripts (no TensorFlow); test_multiworker.py trains through two nodes.
"""

import json
import os
import signal
import subprocess
import textwrap
import time

import pytest

from conftest import ended, run_script, script_failed, sigint_as_in_a_terminal, start_script
from trainer.launch import links, rendezvous
from trainer.launch.agreement import Node, node_cluster
from trainer.launch.job import free_ports
from trainer.launch.secret import SECRET_ENV


def test_node_cluster_orders_tasks_by_node_and_puts_the_chief_on_node_0():
    nodes = [Node(1, "b", 1, 0, (7, 8)), Node(0, "a", 2, 0, (1, 2, 3))]
    cluster, own = node_cluster(nodes)
    assert cluster == {"worker": ["a:1", "a:2", "b:7"]}  # worker 0, the chief, is node 0's first
    assert own == [[("worker", 0), ("worker", 1)], [("worker", 2)]]

    cluster, own = node_cluster([Node(0, "a", 1, 0, (1, 2)), Node(1, "b", 2, 1, (5, 6, 7, 8))])
    assert cluster == {"chief": ["a:2"], "worker": ["a:1", "b:5", "b:6"], "ps": ["b:7"]}
    assert own == [[("chief", 0), ("worker", 0)], [("worker", 1), ("worker", 2), ("ps", 0)]]


def _script(tmp_path, body, name="task.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


SECRET = "a secret of this test"


def _node(rank, nnodes, port, script, *args, workers=1, ps=0, timeout=30, secret=SECRET, options=(), cwd=None):
    launch = ("--nnodes", nnodes, "--node-rank", rank, "--master-addr", "localhost", "--master-port", port,
              "--workers", workers, "--ps", ps, "--rdzv-timeout", timeout, *options)
    return start_script(script, *args, launch=launch, env={SECRET_ENV: secret}, cwd=cwd)


def _outputs(*procs, timeout=60):
    """Every launcher once all have exited (`ended`): their outputs, and `script_failed(*launchers)` for the
    messages; kills them all if one is still running after `timeout`."""
    deadline = time.monotonic() + timeout
    try:
        launchers = [ended(proc, max(1.0, deadline - time.monotonic())) for proc in procs]
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        pytest.fail(f"a launcher still ran {timeout}s on:\n{script_failed(*(ended(proc) for proc in procs))}")
    return [launcher.stdout for launcher in launchers], script_failed(*launchers)


def _gone(pid):
    """No such process, or a zombie: dead, and not reaped where its new parent (the container's init) does not."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


REPORT = """
    import json, os, sys, time
    config = json.loads(os.environ["TF_CONFIG"])
    print("config", json.dumps(config), os.environ["TRAINER_LAUNCH"], flush=True)
"""


def test_every_task_of_every_node_gets_the_same_cluster(tmp_path):
    script = _script(tmp_path, REPORT)
    port = free_ports(1)[0]
    node1 = _node(1, 2, port, script, workers=1)  # it may start first: it waits for node 0
    time.sleep(0.5)
    node0 = _node(0, 2, port, script, workers=2)
    (out0, out1), failed = _outputs(node0, node1)
    assert (node0.returncode, node1.returncode) == (0, 0), failed
    configs = {line.split("]")[0] + "]": json.loads(line.split("config ")[1].rsplit("}", 1)[0] + "}")
               for line in (out0 + out1).splitlines() if " config " in line}
    assert sorted(configs) == ["[worker:0]", "[worker:1]", "[worker:2]"]
    clusters = [config["cluster"] for config in configs.values()]
    assert all(cluster == clusters[0] for cluster in clusters) and len(clusters[0]["worker"]) == 3
    assert [configs[f"[worker:{i}]"]["task"] for i in range(3)] == [{"type": "worker", "index": i} for i in range(3)]
    assert "[worker:0]" in out0 and "[worker:1]" in out0 and "[worker:2]" in out1
    assert "trainer-launch on 2 nodes (node 0 at localhost)" in out1


def test_a_failed_task_on_one_node_stops_every_node_with_its_status(tmp_path):
    script = _script(tmp_path, """
        import json, os, sys, time
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
            time.sleep(1)
            sys.exit(3)
        time.sleep(60)
    """)
    port = free_ports(1)[0]
    start = time.monotonic()
    node0, node1 = _node(0, 2, port, script), _node(1, 2, port, script)
    (out0, out1), failed = _outputs(node0, node1)
    assert (node0.returncode, node1.returncode) == (3, 3), failed
    assert "[launcher] task worker:1 failed with exit status 3; stopping the others" in out1
    assert "[launcher] node 1: task worker:1 failed with exit status 3; stopping every task here" in out0
    assert time.monotonic() - start < 30


PIDS = """
    import os, time
    with open({marker!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    time.sleep(60)
"""


def _wait_for_pids(marker, count, timeout=30):
    deadline = time.monotonic() + timeout
    while (not marker.exists() or len(marker.read_text().split()) < count) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [int(pid) for pid in marker.read_text().split()]


def _no_survivors(pids):
    survivors = [pid for pid in pids if not _gone(pid)]
    for pid in survivors:  # leave no task behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    return survivors


@pytest.mark.parametrize("killed", [1, 0], ids=["node-1", "node-0"])
def test_a_node_killed_outright_stops_the_others_and_leaves_no_task(tmp_path, killed):
    marker = tmp_path / "pids"
    script = _script(tmp_path, PIDS.format(marker=str(marker)))
    port = free_ports(1)[0]
    nodes = [_node(0, 2, port, script), _node(1, 2, port, script)]
    pids = _wait_for_pids(marker, 2)
    nodes[killed].kill()  # its machine gone: the launcher dies, and its task with it
    start = time.monotonic()
    outs, failed = _outputs(*nodes)
    time.sleep(0.5)  # the kernel delivers the task's death signal
    assert not _no_survivors(pids) and len(pids) == 2
    survivor = nodes[1 - killed]
    assert survivor.returncode == 1, failed
    assert (f"[launcher] node {killed}'s launcher is gone (its machine stopped, or it was killed); stopping every "
            "task") in outs[1 - killed]
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_node_stops_every_node(tmp_path, signum, status):
    marker = tmp_path / "pids"
    script = _script(tmp_path, PIDS.format(marker=str(marker)))
    port = free_ports(1)[0]
    with sigint_as_in_a_terminal():
        node0, node1 = _node(0, 2, port, script), _node(1, 2, port, script)
    pids = _wait_for_pids(marker, 2)
    node1.send_signal(signum)
    (out0, out1), failed = _outputs(node0, node1)
    assert not _no_survivors(pids)
    assert (node0.returncode, node1.returncode) == (status, status), failed
    assert "[launcher] interrupted; stopping every task" in out1
    assert "[launcher] node 1: interrupted; stopping every task here" in out0


def _connected(port: int, timeout: float = 60.0) -> None:
    """Returns once a node holds a connection to node 0's rendezvous on `port` (an established socket there, in
    /proc/net/tcp): a fixed 3 s for two launchers to start lost the race on a loaded machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as rows:
                for row in rows.readlines()[1:]:
                    local, state = row.split()[1], row.split()[3]
                    if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                        return
        time.sleep(0.1)
    pytest.fail(f"no node connected to node 0's rendezvous on port {port} within {timeout:.0f} s")


def test_sigterm_while_waiting_for_the_nodes_stops_at_once(tmp_path):
    script = _script(tmp_path, "pass\n")
    port = free_ports(1)[0]
    node0, node1 = _node(0, 3, port, script, timeout=60), _node(1, 3, port, script, timeout=60)
    _connected(port)
    time.sleep(1)  # node 0 has heard node 1 out, so node 1 has arrived; node 2 never will
    start = time.monotonic()
    node0.send_signal(signal.SIGTERM)  # not SIGINT: a test run started in the background ignores it
    (out0, out1), failed = _outputs(node0, node1, timeout=20)
    assert (node0.returncode, node1.returncode) == (143, 1), failed
    assert "node 0 was interrupted before every node had arrived" in out0 and "interrupted" in out1
    assert time.monotonic() - start < 5


def test_a_node_that_never_arrives_is_named_and_nothing_starts(tmp_path):
    marker = tmp_path / "started"
    script = _script(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    port = free_ports(1)[0]
    start = time.monotonic()
    node0, node1 = _node(0, 3, port, script, timeout=3), _node(1, 3, port, script, timeout=3)
    (out0, out1), failed = _outputs(node0, node1)
    assert (node0.returncode, node1.returncode) == (1, 1), failed
    assert "node(s) 2 of 3 never joined the rendezvous at localhost:" in out0
    assert "(joined: 0, 1)" in out0 and "--node-rank N" in out0
    assert "never joined" in out1  # node 0 tells the nodes that did arrive
    assert not marker.exists()
    assert time.monotonic() - start < 20


def test_a_node_without_node_0_says_where_it_looked(tmp_path):
    script = _script(tmp_path, "pass\n")
    port = free_ports(1)[0]
    (out,), failed = _outputs(_node(1, 2, port, script, timeout=2))
    assert f"[launcher] node 1 could not reach node 0's rendezvous at localhost:{port} in 2 s" in out, failed
    assert "--node-rank 0 on localhost" in out, failed


def test_nodes_started_with_another_node_count_are_refused(tmp_path):
    script = _script(tmp_path, "pass\n")
    port = free_ports(1)[0]
    node0, node1 = _node(0, 2, port, script), _node(1, 3, port, script)
    (out0, out1), failed = _outputs(node0, node1)
    assert (node0.returncode, node1.returncode) == (1, 1)
    for out in (out0, out1):
        assert "node 1 was started with --nnodes 3 and node 0 with --nnodes 2" in out


def test_parameter_server_tasks_on_the_nodes_and_the_chief_on_node_0(tmp_path):
    """The chief runs the script; the other tasks run `--serve` until the chief is done, on every node."""
    script = _script(tmp_path, REPORT + "    time.sleep(1)\n")
    port = free_ports(1)[0]
    node0, node1 = _node(0, 2, port, script, workers=1), _node(1, 2, port, script, workers=1, ps=1)
    (out0, out1), failed = _outputs(node0, node1, timeout=90)
    assert (node0.returncode, node1.returncode) == (0, 0), failed
    config = json.loads(out0.split("[chief:0] config ")[1].split(" trainer-launch")[0])
    assert [len(config["cluster"][kind]) for kind in ("chief", "worker", "ps")] == [1, 2, 1]
    assert config["task"] == {"type": "chief", "index": 0}
    assert "config" not in out1  # node 1 only serves


def test_a_node_with_another_secret_is_refused_and_named_and_nothing_starts(tmp_path):
    marker = tmp_path / "started"
    script = _script(tmp_path, f"open({str(marker)!r}, 'w').close()\n")
    port = free_ports(1)[0]
    node0, node1 = _node(0, 2, port, script), _node(1, 2, port, script, secret="another secret")
    (out0, out1), failed = _outputs(node0, node1)
    assert (node0.returncode, node1.returncode) == (1, 1), failed
    for out in (out0, out1):
        assert "node 1 at 127.0.0.1 presented another secret than node 0's: it was refused" in out
    assert "another secret" not in " ".join(out0.split("presented another secret")[::2])  # never the secret
    assert not marker.exists()


def test_node_addr_and_a_secret_file_are_what_the_cluster_uses(tmp_path):
    script = _script(tmp_path, REPORT + "    print('secret', os.environ.get('TRAINER_RDZV_SECRET'), flush=True)\n")
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    port = free_ports(1)[0]
    node0 = _node(0, 2, port, script, options=("--node-addr", "127.0.0.1"))
    node1 = _node(1, 2, port, script, secret=None, options=("--node-addr", "127.0.0.1", "--rdzv-secret-file",
                                                            str(secret_file)))
    (out0, out1), failed = _outputs(node0, node1)
    assert (node0.returncode, node1.returncode) == (0, 0), failed
    config = json.loads(out1.split("[worker:1] config ")[1].split(" trainer-launch")[0])
    assert [address.split(":")[0] for address in config["cluster"]["worker"]] == ["127.0.0.1", "127.0.0.1"]
    assert "secret None" in out0 and "secret None" in out1  # the tasks do not see the secret


def test_a_rendezvous_that_does_not_answer_with_the_secret_is_not_taken_for_node_0(tmp_path):
    import socket
    import threading

    listener = socket.create_server(("localhost", 0))
    port = listener.getsockname()[1]

    def impostor():  # challenges as node 0 does, then hands out a cluster without the job's secret
        connection = listener.accept()[0]
        channel = links.Channel(connection)
        channel.send({"challenge": "0" * 32})
        channel.receive(10)
        channel.send({"cluster": {"worker": ["localhost:1", "localhost:2"]}, "tasks": [["worker", 1]],
                      "proof": "0" * 64})
        time.sleep(1)
        connection.close()

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    with listener, pytest.raises(rendezvous.RendezvousError, match="not with this job's secret"):
        rendezvous.join(nnodes=(2, 2), node_rank=1, master_addr="localhost", master_port=port, workers=1, ps=0,
                        timeout=5, free_ports=free_ports, secret=b"the job's")
    thread.join(timeout=5)


ELASTIC = """
    import json, os, sys, time
    config, launch = json.loads(os.environ["TF_CONFIG"]), os.environ["TRAINER_LAUNCH"]
    restart = int(launch.split("restart ")[1].split(" ")[0]) if "restart " in launch else 0
    task = config["task"]["type"] + str(config["task"]["index"])
    folder = os.path.dirname(__file__)
    print("round", restart, task, launch, flush=True)
    open(os.path.join(folder, f"started-{restart}-{task}"), "w").close()
    plan = sys.argv[1].split(",")[restart]  # what this round's tasks do: "wait" (for the test), "fail" or "done"
    while plan != "done" and not os.path.exists(os.path.join(folder, f"go-{restart}")):
        time.sleep(0.1)
    sys.exit(5 if plan == "fail" else 0)
"""
def _elastic_node(rank, port, script, plan, restarts, **kwargs):
    """A node of a job over 1 or 2 machines, with `restarts` restarts and a last call of 1 s."""
    return _node(rank, "1:2", port, script, plan, options=("--rdzv-last-call", "1", "--max-restarts", str(restarts)),
                 **kwargs)


def _wait_for(path, timeout=30):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.1)


def test_a_node_killed_mid_run_restarts_the_job_on_the_nodes_left(tmp_path):
    script = _script(tmp_path, ELASTIC)
    port = free_ports(1)[0]
    node0, node1 = (_elastic_node(rank, port, script, "wait,done", 1, cwd=tmp_path) for rank in (0, 1))
    _wait_for(tmp_path / "started-0-worker1")
    node1.kill()  # its machine gone: its task dies with it
    (out0, out1), failed = _outputs(node0, node1)
    assert (node0.returncode, node1.returncode) == (0, -9), failed
    assert ("[launcher] restart 1 of 1: node 1's launcher is gone (its machine stopped, or it was killed); starting "
            "again: meeting at the rendezvous") in out0
    assert "[launcher] restart 1 of 1: 1 node, 1 worker now (before: 2 nodes, 2 workers)" in out0
    assert ("round 1 worker0 trainer-launch on 1 node (node 0 at localhost), restart 1 of 1 (before: 2 nodes, 2 "
            "workers)") in out0
    assert not (tmp_path / "started-1-worker1").exists()


def _node_1_lost_and_back(tmp_path, plan: str, restarts: int):
    """Node 1 dies in round 0 and comes back while node 0 runs round 1 alone, which then ends as `plan` says;
    the outputs and statuses of node 0 and of the node that came back, and `script_failed` of the two."""
    script = _script(tmp_path, ELASTIC)
    port = free_ports(1)[0]
    node0, node1 = (_elastic_node(rank, port, script, plan, restarts, cwd=tmp_path) for rank in (0, 1))
    _wait_for(tmp_path / "started-0-worker1")
    node1.kill()
    _wait_for(tmp_path / "started-1-worker0")  # the job goes on alone
    back = _elastic_node(1, port, script, plan, restarts, cwd=tmp_path)  # waits for the next restart
    time.sleep(2)
    (tmp_path / "go-1").touch()  # round 1 ends
    (out0, out_back), failed = _outputs(node0, back)
    node1.communicate()
    return (out0, out_back), (node0.returncode, back.returncode), failed


def test_a_node_that_comes_back_joins_at_the_next_restart(tmp_path):
    plan = "wait,fail,done"  # round 1 fails: a restart
    (out0, out_back), statuses, failed = _node_1_lost_and_back(tmp_path, plan, 2)
    assert statuses == (0, 0), failed
    assert "[launcher] restart 2 of 2: 2 nodes, 2 workers now (before: 1 node, 1 worker)" in out0
    assert "round 2 worker1 trainer-launch on 2 nodes" in out_back
    assert "[launcher] restart 2 of 2: 2 nodes, 2 workers now" in out_back


def test_a_node_that_comes_back_to_a_job_that_then_completes_ends_with_it(tmp_path):
    """No restart comes after node 1 returns: node 0 tells it the job is done."""
    (out0, out_back), statuses, failed = _node_1_lost_and_back(tmp_path, "wait,wait", 1)  # round 1 completes the job
    assert statuses == (0, 0), failed
    assert ("[launcher] node 1: the job completed while this node waited to join it at a restart; nothing to do"
            in out_back)
    assert "round" not in out_back  # it ran no task


def test_a_preempted_node_stops_its_tasks_and_leaves_and_the_others_go_on(tmp_path):
    script = _script(tmp_path, ELASTIC)
    port = free_ports(1)[0]
    node0, node1 = (_elastic_node(rank, port, script, "wait,done", 1, cwd=tmp_path) for rank in (0, 1))
    _wait_for(tmp_path / "started-0-worker1")
    node1.send_signal(signal.SIGTERM)  # a preemption notice
    (out0, out1), failed = _outputs(node0, node1)
    assert (node0.returncode, node1.returncode) == (0, 143), failed
    assert "[launcher] interrupted; stopping every task" in out1 and "restart 1 of" not in out1
    assert "[launcher] restart 1 of 1: node 1: interrupted; starting again" in out0
    assert "round 1 worker0 trainer-launch on 1 node" in out0


def test_restarts_used_up_on_nodes_end_with_the_failures_status_and_reason(tmp_path):
    script = _script(tmp_path, ELASTIC)
    port = free_ports(1)[0]
    (tmp_path / "go-0").touch()
    (tmp_path / "go-1").touch()
    node0, node1 = (_elastic_node(rank, port, script, "fail,fail", 1, cwd=tmp_path) for rank in (0, 1))
    (out0, out1), failed = _outputs(node0, node1)
    assert (node0.returncode, node1.returncode) == (5, 5), failed
    assert "[launcher] no restart left (1 of 1 used): " in out0 and "failed with exit status 5" in out0
    assert (tmp_path / "started-1-worker1").exists()  # the second round ran on both nodes


@pytest.mark.parametrize("args, message", [
    (["--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], "--node-rank must be 0 to 1 (--nnodes 2)"),
    (["--nnodes", "2", "--node-rank", "1"], "--nnodes 2 needs --master-addr"),
    (["--node-rank", "1"], "--nnodes is 1. Received: --node-rank 1"),
    (["--nnodes", "2", "--master-addr", "h"], "needs a shared secret"),
    (["--nnodes", "2", "--master-addr", "h", "--rdzv-secret-file", "/nonexistent/secret"],
     "--rdzv-secret-file must be a readable file. Received: --rdzv-secret-file '/nonexistent/secret'"),
    (["--nnodes", "2", "--master-addr", "h", "--node-addr", " "], "--node-addr must be this machine's address"),
    (["--nnodes", "3:2", "--master-addr", "h"], "with 1 <= MIN <= MAX. Received: --nnodes '3:2'"),
    (["--max-restarts", "-1"], "--max-restarts must be an integer >= 0. Received: --max-restarts '-1'"),
    (["--nnodes", "1:2", "--master-addr", "h"], "--nnodes 1:2 lets the job go on with fewer nodes, which takes "
                                                "restarts. Received: --max-restarts 0"),
], ids=["rank-out-of-range", "no-master-addr", "rank-without-nnodes", "no-secret", "secret-file-missing",
        "node-addr-empty", "nnodes-min-above-max", "negative-restarts", "elastic-without-restarts"])
def test_bad_node_options_are_usage_errors(tmp_path, args, message):
    script = _script(tmp_path, "pass\n")
    proc = run_script(script, launch=args, env={SECRET_ENV: None}, check=False)
    assert proc.returncode == 2 and message in proc.stderr, script_failed(proc)
