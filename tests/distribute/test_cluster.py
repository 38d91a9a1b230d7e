"""trainer/distribute/cluster.py under Slurm: the step's tasks, their addresses and roles, from Slurm's environment."""

import pytest

from trainer import _compat
from trainer.distribute.cluster import ClusterInfo, cluster_info, cluster_source
from trainer.distribute.slurm import slurm_addresses, slurm_step

# What srun gave task 3 of `srun -N 2 -n 5` on nodes gpu9 and gpu10 (Slurm lists them in its own order).
STEP = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "5", "SLURM_STEP_NODELIST": "gpu[9-10]",
        "SLURM_STEP_TASKS_PER_NODE": "3,2", "SLURM_STEP_NUM_NODES": "2", "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0"}


def _addresses(env):
    return slurm_addresses(slurm_step(env), _compat.expand_hostlist, _compat.expand_tasks_per_node)


def test_ranks_fill_the_nodes_in_slurms_order_with_one_port_each(monkeypatch):
    monkeypatch.delenv("TRAINER_SLURM_PORT_BASE", raising=False)
    step = slurm_step(STEP)
    assert (step.task_id, step.num_tasks, step.num_nodes) == (3, 5, 2)
    base = step.port_base()
    assert 12000 <= base < 28000 and base == slurm_step(dict(STEP, SLURM_PROCID="0")).port_base()  # alike
    # gpu9 before gpu10, as Slurm lists them: TensorFlow's SlurmClusterResolver sorts them by name instead.
    assert _addresses(STEP) == [f"gpu9:{base}", f"gpu9:{base + 1}", f"gpu9:{base + 2}",
                                f"gpu10:{base}", f"gpu10:{base + 1}"]
    assert slurm_step(dict(STEP, SLURM_JOB_ID="4243")).port_base() != base  # another job, other ports
    monkeypatch.setenv("TRAINER_SLURM_PORT_BASE", "23456")
    assert _addresses(dict(STEP, SLURM_STEP_NODELIST="a,b", SLURM_STEP_TASKS_PER_NODE="2(x2)",
                           SLURM_STEP_NUM_TASKS="4"))[1:3] == ["a:23457", "b:23456"]
    for wrong in ("2345x", "80", "65535"):
        monkeypatch.setenv("TRAINER_SLURM_PORT_BASE", wrong)
        with pytest.raises(ValueError, match=rf"TRAINER_SLURM_PORT_BASE must be a port number .* Received: "
                                             rf"TRAINER_SLURM_PORT_BASE='{wrong}'. Set it to a free port"):
            step.port_base()


def test_a_step_of_several_tasks_is_a_cluster_whose_chief_is_task_0(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for key, value in STEP.items():
        monkeypatch.setenv(key, value)
    assert cluster_info() == ClusterInfo(task_type="worker", task_id=3, num_workers=5)
    assert not cluster_info().is_chief
    assert cluster_source() == "Slurm: 5 tasks on 2 nodes, chief task 0 (job 4242, step 0)"
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert cluster_info().is_chief
    # TF_CONFIG, where set, describes the cluster (a launcher or Kubernetes inside a Slurm job).
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}')
    assert cluster_info().task_id == 1 and cluster_source() == "TF_CONFIG: 2 workers; chief: worker 0"


def test_one_task_and_an_sbatch_scripts_own_process_are_one_process(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for key, value in dict(STEP, SLURM_PROCID="0", SLURM_STEP_NUM_TASKS="1").items():
        monkeypatch.setenv(key, value)
    assert cluster_info() == ClusterInfo() and cluster_source() == ""
    # An sbatch script runs as the job's batch step: no SLURM_STEP_* variables, whatever --ntasks says.
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert slurm_step() is None and cluster_info() == ClusterInfo()


def test_a_distribution_other_than_block_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"SLURM_DISTRIBUTION='cyclic'.*--distribution=block"):
        _addresses(dict(STEP, SLURM_DISTRIBUTION="cyclic"))
    assert len(_addresses(dict(STEP, SLURM_DISTRIBUTION="block:cyclic"))) == 5


def test_slurm_values_that_do_not_add_up_are_refused():
    with pytest.raises(ValueError, match=r"SLURM_PROCID='x'"):
        slurm_step(dict(STEP, SLURM_PROCID="x"))
    with pytest.raises(ValueError, match=r"add up to the step's 5 tasks.*SLURM_STEP_TASKS_PER_NODE='2,2'"):
        _addresses(dict(STEP, SLURM_STEP_TASKS_PER_NODE="2,2"))


def test_the_launcher_and_tf_config_name_themselves(monkeypatch):
    config = '{"cluster": {"chief": ["h:1"], "worker": ["h:2", "h:3"], "ps": ["h:4"]}, "task": {"type": "chief"}}'
    monkeypatch.setenv("TF_CONFIG", config)
    monkeypatch.delenv("TRAINER_LAUNCH", raising=False)
    assert cluster_source() == "TF_CONFIG: 1 chief, 2 workers, 1 ps; chief: the chief task"
    monkeypatch.setenv("TRAINER_LAUNCH", "trainer-launch on this machine")
    assert cluster_source() == "trainer-launch on this machine: 1 chief, 2 workers, 1 ps; chief: the chief task"
