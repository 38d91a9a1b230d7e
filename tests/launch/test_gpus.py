"""One GPU set per local worker: trainer-launch's split of a machine's GPUs, on a fake `nvidia-smi` listing, and
srun's tasks by their local ids. The tasks run no TensorFlow: they print the CUDA_VISIBLE_DEVICES they got."""

import os
import stat
import subprocess
import sys

import pytest

from trainer.distribute import gpus

SHOW = "import os; print('sees', os.environ.get('CUDA_VISIBLE_DEVICES'))\n"


def _fake_smi(folder, count):
    """A `nvidia-smi` that lists `count` GPUs as NVIDIA's does, first on PATH."""
    folder.mkdir(exist_ok=True)
    smi = folder / "nvidia-smi"
    lines = "\n".join(f"GPU {i}: NVIDIA A100-SXM4-40GB (UUID: GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd)"
                      for i in range(count))
    smi.write_text(f"#!/bin/sh\n[ \"$1\" = -L ] || exit 9\ncat <<'EOF'\n{lines}\nEOF\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return str(folder)


def _env(tmp_path, count, **extra):
    env = {k: v for k, v in os.environ.items() if k != gpus.VISIBLE and not k.startswith("SLURM_")}
    env["PATH"] = _fake_smi(tmp_path / "bin", count) + os.pathsep + env["PATH"]
    env.update(extra)
    return env


def _launch(tmp_path, env, *options, workers=2):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    return subprocess.run([sys.executable, "-m", "trainer.launch", "--workers", str(workers), *options, str(script)],
                          env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)


def _seen(output):
    """task name -> the CUDA_VISIBLE_DEVICES it printed."""
    return dict(line.split("] sees ") for line in output.splitlines() if "] sees " in line)


def test_the_listing_comes_from_nvidia_smi_or_the_users_setting(tmp_path, monkeypatch):
    assert gpus.machine_gpus(_env(tmp_path, 4)) == (["0", "1", "2", "3"], "nvidia-smi -L")
    assert gpus.machine_gpus(_env(tmp_path, 4, CUDA_VISIBLE_DEVICES="5,7")) == (["5", "7"],
                                                                                 "CUDA_VISIBLE_DEVICES='5,7'")
    # CUDA stops at the first entry that names no device
    assert gpus.machine_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,2"})[0] == ["1"]
    assert gpus.machine_gpus({"CUDA_VISIBLE_DEVICES": "-1"})[0] == []
    # without nvidia-smi, the driver's folders; without either, none
    proc = tmp_path / "proc"
    for address in ("0000:07:00.0", "0000:0f:00.0"):
        (proc / address).mkdir(parents=True)
    monkeypatch.setattr(gpus, "PROC_GPUS", str(proc))
    assert gpus.machine_gpus({"PATH": str(tmp_path / "nothing")}) == (["0", "1"], str(proc))
    monkeypatch.setattr(gpus, "PROC_GPUS", str(tmp_path / "absent"))
    assert gpus.machine_gpus({"PATH": str(tmp_path / "nothing")}) == ([], "no NVIDIA GPU found")


def test_the_split_gives_each_worker_its_own_gpus():
    assert gpus.split(["0", "1"], 2, None) == [["0"], ["1"]]
    assert gpus.split(["0", "1", "2", "3"], 2, None) == [["0", "1"], ["2", "3"]]
    assert gpus.split(["0", "1", "2", "3"], 3, None) == [["0"], ["1"], ["2"]]  # one left idle, and said
    assert "1 GPU(s) left idle" in gpus.shares_text([["0"], ["1"], ["2"]], ["0", "1", "2", "3"])
    assert gpus.split(["0", "1", "2", "3"], 2, 1) == [["0"], ["1"]]
    assert gpus.split(["0", "1"], 3, 0) == [[], [], []]  # CPU workers
    assert gpus.visible([]) == "-1"
    assert gpus.split([], 2, None) == [[], []]  # no GPU: nothing to split
    with pytest.raises(ValueError, match=r"--workers 3 on a machine with 2 GPU\(s\).*--workers 2.*--gpus-per-worker 0"):
        gpus.split(["0", "1"], 3, None)
    with pytest.raises(ValueError, match=r"--gpus-per-worker 3 for 2 worker\(s\) needs 6 GPUs.*--gpus-per-worker 2"):
        gpus.split(["0", "1", "2", "3"], 2, 3)
    with pytest.raises(ValueError, match="--gpus-per-worker 1"):
        gpus.split([], 2, 1)


@pytest.mark.parametrize("count, expected", [(2, {"worker:0": "0", "worker:1": "1"}),
                                             (4, {"worker:0": "0,1", "worker:1": "2,3"})])
def test_the_launcher_gives_two_workers_their_share(tmp_path, count, expected):
    done = _launch(tmp_path, _env(tmp_path, count))
    assert done.returncode == 0, done.stdout + done.stderr
    assert {k.strip("["): v for k, v in _seen(done.stdout).items()} == expected
    assert "[launcher] GPUs: worker 0 on " in done.stdout


def test_the_launcher_keeps_the_users_cuda_visible_devices_and_splits_it(tmp_path):
    done = _launch(tmp_path, _env(tmp_path, 8, CUDA_VISIBLE_DEVICES="5,7"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert {k.strip("["): v for k, v in _seen(done.stdout).items()} == {"worker:0": "5", "worker:1": "7"}


def test_three_workers_on_two_gpus_are_refused_before_anything_starts(tmp_path):
    done = _launch(tmp_path, _env(tmp_path, 2), workers=3)
    assert done.returncode == 2
    assert "--workers 3 on a machine with 2 GPU(s) (nvidia-smi -L)" in done.stderr
    assert "--gpus-per-worker 0" in done.stderr and "sees" not in done.stdout
    cpu = _launch(tmp_path, _env(tmp_path, 2), "--gpus-per-worker", "0", workers=3)  # unless asked for CPU workers
    assert cpu.returncode == 0, cpu.stdout + cpu.stderr
    assert set(_seen(cpu.stdout).values()) == {"-1"} and len(_seen(cpu.stdout)) == 3


def test_a_machine_without_gpus_leaves_the_environment_as_it_is(tmp_path):
    env = _env(tmp_path, 0)
    done = _launch(tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    if not os.path.isdir(gpus.PROC_GPUS):
        assert set(_seen(done.stdout).values()) == {"None"} and "GPUs:" not in done.stdout


def _srun_env(tmp_path, count, local_id, tasks_per_node="2", node_id=0, **extra):
    return _env(tmp_path, count, SLURM_PROCID=str(2 * node_id + local_id), SLURM_STEP_NUM_TASKS="4",
                SLURM_STEP_NODELIST="gpu[01-02]", SLURM_STEP_TASKS_PER_NODE=tasks_per_node, SLURM_STEP_NUM_NODES="2",
                SLURM_LOCALID=str(local_id), SLURM_NODEID=str(node_id), SLURM_JOB_ID="7", SLURM_STEP_ID="0", **extra)


def test_srun_tasks_take_their_share_by_local_id(tmp_path):
    assert gpus.tasks_on_node("4(x2),2", 1) == 4 and gpus.tasks_on_node("4(x2),2", 2) == 2
    assert gpus.slurm_share(_srun_env(tmp_path, 4, 1, "2(x2)", 1)) == (2, ["2", "3"], "2,3")
    assert gpus.slurm_share(_srun_env(tmp_path, 4, 0, "2(x2)", 1)) == (0, ["0", "1"], "0,1")
    # Slurm's own binding, one task per node, or no GPU: nothing to change
    assert gpus.slurm_share(_srun_env(tmp_path, 4, 1, "2(x2)", SLURM_GPUS_PER_TASK="1")) is None
    assert gpus.slurm_share(_srun_env(tmp_path, 4, 0, "1(x2)")) is None
    assert gpus.slurm_share(_srun_env(tmp_path, 0, 1)) is None or os.path.isdir(gpus.PROC_GPUS)
    # the GPUs Slurm gave the job, shared by the node's tasks
    assert gpus.slurm_share(_srun_env(tmp_path, 8, 1, CUDA_VISIBLE_DEVICES="4,6"))[2] == "6"
    with pytest.raises(ValueError, match=r"3 tasks of this srun share a node with 2 GPU\(s\).*--ntasks-per-node=2"):
        gpus.slurm_share(_srun_env(tmp_path, 2, 2, "3,1"))


def test_trainer_launch_under_srun_gives_the_task_its_share(tmp_path):
    script = tmp_path / "show.py"
    script.write_text(SHOW)
    done = subprocess.run([sys.executable, "-m", "trainer.launch", str(script)], cwd=tmp_path, timeout=120,
                          env=_srun_env(tmp_path, 4, 1), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sees 2,3" in done.stdout and "task 1: GPUs 2,3 (CUDA_VISIBLE_DEVICES" in done.stdout


def test_the_plan_names_the_gpus_of_this_worker(monkeypatch):
    from trainer.distribute import strategy as strategy_lib

    class OnGPUs:
        class extended:
            worker_devices = ("/job:worker/replica:0/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:GPU:1")

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert strategy_lib.gpus_text(OnGPUs()) == "this worker: GPU:0, GPU:1 of CUDA_VISIBLE_DEVICES=2,3"

    class OnCPUs:
        class extended:
            worker_devices = ("/job:localhost/replica:0/task:0/device:CPU:0",)
    assert strategy_lib.gpus_text(OnCPUs()) == ""


def test_srun_python_script_makes_its_share_visible_before_the_strategy(tmp_path, monkeypatch):
    # `srun python script.py` without the launcher: the trainer's Slurm resolver shows TensorFlow the task's
    # GPUs (faked: TensorFlow lists four) before MultiWorkerMirroredStrategy starts the devices.
    import tensorflow as tf

    from trainer.distribute import strategy as strategy_lib

    for key, value in _srun_env(tmp_path, 4, 1, "2(x2)", 1).items():
        if key.startswith("SLURM_"):
            monkeypatch.setenv(key, value)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    listed = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(4)]
    shown = []
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: listed if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda devices, kind: shown.append((devices, kind)))
    resolver = strategy_lib._slurm_resolver()
    assert shown == [(listed[2:4], "GPU")]
    assert resolver.num_accelerators() == {"GPU": 2} and resolver.task_id == 3
