"""docs/howto/cluster.md and parameter_servers.md as a reader follows them: cluster.md's diff is
examples/train.py's, and the pages' commands run as written.

Every command line of the page's bash blocks is either run here, in a folder of the test's (the script
writes model.keras where it runs), with this environment's `python` and `trainer-launch` first on PATH as
after `source .venv/bin/activate`; or listed in NOT_HERE with the reason. Each run must print the
one-process run's `test loss` line: the page's promise is the same numbers on every layout.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TESTS
import slurm_cluster

pytestmark = pytest.mark.slow  # whole trainings in processes of their own

ROOT = TESTS.parent
PAGE = (ROOT / "docs" / "howto" / "cluster.md").read_text()
PS_PAGE = (ROOT / "docs" / "howto" / "parameter_servers.md").read_text()

ONE = "python examples/train.py"
TWO_REPLICAS = "python examples/train.py --cpu-replicas 2 --strategy mirrored"
TWO_WORKERS = "trainer-launch --workers 2 examples/train.py"
SECRET = ("python3 -c 'import secrets; print(secrets.token_hex(16))' > ~/.trainer-secret "
          "&& chmod 600 ~/.trainer-secret")
NODE = ("trainer-launch --nnodes 2 --node-rank {rank} --master-addr host0 --rdzv-secret-file ~/.trainer-secret "
        "examples/train.py")
SRUN = "srun -n 2 python examples/train.py"
SBATCH = "sbatch train.sbatch"
NOT_HERE = {
    "scp -p ~/.trainer-secret host1:": "copies to another machine; here both nodes share one home",
    "srun -N 2 --ntasks-per-node=1 --gpus-per-node=4 python examples/train.py": "needs 2 nodes with GPUs",
    "docker build -t trainer:latest .": "no Docker daemon here, and the base image is not on a package registry "
                                        "(tests/distribute/test_kubernetes.py checks the Dockerfile as a file)",
    "kubectl apply -f examples/kubernetes/indexed-job.yaml": "no Kubernetes cluster (test_kubernetes.py reads it)",
    "kubectl apply -f examples/kubernetes/tfjob.yaml": "no Kubernetes cluster (test_kubernetes.py reads it)",
}
RUN = {ONE, TWO_REPLICAS, TWO_WORKERS, SECRET, NODE.format(rank=0), NODE.format(rank=1), SRUN, SBATCH}
PS_LOCAL = "trainer-launch --workers 2 --ps 1 examples/train.py"
PS_SRUN = "srun -n 4 trainer-launch --ps 1 examples/train.py"


def _blocks(language: str, page: str = PAGE) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page, re.S | re.M)


def _commands(page: str = PAGE) -> set[str]:
    """The command lines of the page's bash blocks, their comments cut; the batch script is a file, not commands."""
    lines = [line for block in _blocks("bash", page) if not block.startswith("#!") for line in block.splitlines()]
    return {re.sub(r"\s+#.*$", "", line).strip() for line in lines if not line.startswith("#")}


def _batch_script() -> str:
    (script,) = [block for block in _blocks("bash") if block.startswith("#!/bin/bash\n#SBATCH")]
    return script


def _diff_sides() -> tuple[str, str]:
    (diff,) = _blocks("diff")
    lines = diff.splitlines()
    before = [line[1:] for line in lines if line[:1] in " -"]
    after = [line[1:] for line in lines if line[:1] in " +"]
    return "\n".join(before) + "\n", "\n".join(after) + "\n"


def _reader_folder(path: Path) -> Path:
    """Where the reader runs the commands: the repository's examples, the reader's home, files written here."""
    (path / "examples").symlink_to(ROOT / "examples")
    (path / "home").mkdir()
    return path


@pytest.fixture
def folder(tmp_path):
    return _reader_folder(tmp_path)


def _environment(folder, extra=None) -> dict:
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # the venv, activated
    return {**os.environ, **(extra or {}), "PATH": path, "HOME": str(folder / "home")}


def _run(command: str, folder, env=None, timeout=300) -> str:
    proc = subprocess.run(command, shell=True, cwd=folder, env=_environment(folder, env), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _test_losses(output: str) -> list[float]:
    return [float(loss) for loss in re.findall(r"test loss (\d+\.\d+), accuracy", output)]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    folder = _reader_folder(tmp_path_factory.mktemp("one"))
    output = _run(ONE, folder)
    assert (folder / "model.keras").exists() and "1 in sync over 1 worker(s)" in output
    (loss,) = _test_losses(output)
    return loss


def test_every_command_of_the_pages_is_run_here_or_said_why_not():
    assert _commands() == RUN | set(NOT_HERE), _commands() ^ (RUN | set(NOT_HERE))
    assert _commands(PS_PAGE) == {PS_LOCAL, PS_SRUN}


def test_the_diff_is_examples_train_py_and_both_sides_train_alike_unshuffled(tmp_path):
    before, after = _diff_sides()
    assert after == (ROOT / "examples" / "train.py").read_text()
    assert "trainer" not in before.replace("docs/howto/cluster.md", "")  # nothing of ours before the change
    losses = []
    for name, script in (("before", before), ("after", after)):  # the page: "with shuffle=False in both"
        unshuffled = script.replace("validation_split=0.1)", "validation_split=0.1, shuffle=False)")
        assert unshuffled != script
        (tmp_path / f"{name}.py").write_text(unshuffled)
        losses += _test_losses(_run(f"{sys.executable} {name}.py --epochs 2", tmp_path))
    assert len(losses) == 2 and losses[0] == pytest.approx(losses[1], abs=2e-6), losses
    assert (tmp_path / "model.keras").exists()


def test_two_replicas_give_the_one_process_numbers(one_process, folder):
    output = _run(TWO_REPLICAS, folder)
    assert "2 in sync over 1 worker(s)" in output and "global 64 = 32 per replica x 2" in output
    assert _test_losses(output) == pytest.approx([one_process], abs=2e-6)


def test_two_local_workers_give_the_one_process_numbers(one_process, folder):
    output = _run(TWO_WORKERS, folder)
    assert "trainer-launch on this machine: 2 workers; chief: worker 0" in output
    assert _test_losses(output) == pytest.approx([one_process] * 2, abs=2e-6)  # each worker prints its own


@pytest.mark.full  # the full tier's: test_two_local_workers and tests/launch/test_nodes.py cover its parts
def test_two_nodes_as_the_page_starts_them_give_the_one_process_numbers(one_process, folder):
    _run(SECRET, folder)
    assert (folder / "home" / ".trainer-secret").stat().st_mode & 0o777 == 0o600
    node = [NODE.format(rank=rank).replace("host0", "127.0.0.1") for rank in (0, 1)]
    env = _environment(folder)
    nodes = [subprocess.Popen(command, shell=True, cwd=folder, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for command in node]
    outputs = [proc.communicate(timeout=300)[0] for proc in nodes]
    assert [proc.returncode for proc in nodes] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    assert "trainer-launch on 2 nodes (node 0 at 127.0.0.1): 2 workers; chief: worker 0" in outputs[0]
    assert _test_losses(outputs[0] + outputs[1]) == pytest.approx([one_process] * 2, abs=2e-6)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    yield from slurm_cluster.one_node(tmp_path_factory.mktemp("slurm"))


def test_srun_of_two_tasks_gives_the_one_process_numbers(one_process, slurm, folder):
    output = _run(SRUN, folder, env=slurm.env)
    assert "Slurm: 2 tasks on 1 node, chief task 0" in output
    assert _test_losses(output) == pytest.approx([one_process] * 2, abs=2e-6)


@pytest.mark.full  # the full tier's: the srun inside it runs in CI's tier above
def test_the_batch_script_runs_on_the_one_node_cluster(one_process, slurm, folder):
    (folder / "train.sbatch").write_text(_batch_script())
    # This cluster is one node without GPUs: the command line overrides the script's --nodes=2 and GPUs.
    command = SBATCH.replace("sbatch", "sbatch --wait --nodes=1 --ntasks-per-node=2 --gpus-per-node=0")
    _run(command, folder, env=slurm.env)
    (log,) = folder.glob("train-*.out")
    output = log.read_text()
    assert _test_losses(output) == pytest.approx([one_process] * 2, abs=2e-6), output[-3000:]
    job = log.stem.split("-")[1]
    backup = folder / "runs" / f"train-{job}" / "backup" / "fit-1"
    assert backup.is_dir() and not os.listdir(backup)  # backed up at each epoch, and gone once done


@pytest.mark.full  # the full tier's: tests/distribute/test_parameter_server.py runs such clusters in CI's
def test_the_parameter_server_pages_cluster_trains_the_script(folder):
    output = _run(PS_LOCAL, folder)
    assert "1 chief, 2 workers, 1 ps" in output and "ParameterServerStrategy (asynchronous)" in output
    (loss,) = _test_losses(output)  # the chief alone runs the script; asynchronous, so no one-device number
    assert loss < 0.6 and (folder / "model.keras").exists()


@pytest.mark.full  # the full tier's: a minute
def test_the_parameter_server_pages_srun_trains_the_script(slurm, folder):
    # 4 tasks on this node's 2 CPUs need --overcommit; --kill-on-bad-exit ends the servers if the chief fails.
    output = _run(PS_SRUN.replace("srun", "srun --overcommit --kill-on-bad-exit=1"), folder, env=slurm.env)
    assert "trainer-launch under Slurm" in output and "1 chief, 2 workers, 1 ps" in output
    (loss,) = _test_losses(output)
    assert loss < 0.6
