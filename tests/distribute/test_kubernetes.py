"""The Kubernetes manifests in examples/kubernetes: the TF_CONFIG each pod gets, read by trainer/distribute/cluster.py.

For the TFJob, TF_CONFIG is made as Kubeflow's training operator makes it
(`genClusterSpec` and `genTFConfigJSONStr` in its tensorflow controller: each
replica type lowercased, `<job>-<type>-<index>.<namespace>.svc:<tfjob-port>`,
the Evaluator left out of the cluster, "environment": "cloud"). For the
Indexed Job, the pod's own command is run with each completion index.
"""

import configparser
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile

import pytest
import yaml

from conftest import TESTS
from trainer.distribute.cluster import ClusterInfo, parse_tf_config
from trainer.distribute.strategy import auto_strategy_name

MANIFESTS = TESTS.parent / "examples" / "kubernetes"


def operator_tf_configs(tfjob: dict, namespace: str = "default") -> dict[tuple[str, int], str]:
    """Every pod's TF_CONFIG, as the training operator sets it for this TFJob."""
    cluster = {}
    for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        if rtype == "Evaluator":  # not part of the training cluster
            continue
        ports = [p for c in spec["template"]["spec"]["containers"] for p in c.get("ports", [])
                 if p.get("name") == "tfjob-port"]
        port = ports[0]["containerPort"] if ports else 2222
        name = tfjob["metadata"]["name"]
        cluster[rtype.lower()] = [f"{name}-{rtype.lower()}-{i}.{namespace}.svc:{port}" for i in range(spec["replicas"])]
    return {(rtype.lower(), i): json.dumps({"cluster": cluster, "task": {"type": rtype.lower(), "index": i},
                                            "environment": "cloud"})
            for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items() for i in range(spec["replicas"])}


def test_the_tfjob_manifest_gives_every_worker_its_place_and_one_chief():
    tfjob = yaml.safe_load((MANIFESTS / "tfjob.yaml").read_text())
    assert tfjob["kind"] == "TFJob" and tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"][
        "containers"][0]["name"] == "tensorflow"
    infos = {key: parse_tf_config(config) for key, config in operator_tf_configs(tfjob).items()}
    assert infos == {("worker", 0): ClusterInfo("worker", 0, num_workers=2),
                     ("worker", 1): ClusterInfo("worker", 1, num_workers=2)}
    assert [key for key, info in infos.items() if info.is_chief] == [("worker", 0)]
    config = json.loads(operator_tf_configs(tfjob)[("worker", 1)])
    assert config["cluster"]["worker"] == ["fashion-mnist-worker-0.default.svc:2222",
                                           "fashion-mnist-worker-1.default.svc:2222"]


def test_a_tfjob_with_chief_workers_ps_and_evaluator_is_read_and_the_evaluator_refused(monkeypatch):
    tfjob = yaml.safe_load((MANIFESTS / "tfjob.yaml").read_text())
    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
    tfjob["spec"]["tfReplicaSpecs"] = {"Chief": {**worker, "replicas": 1}, "Worker": worker,
                                       "PS": {**worker, "replicas": 1}, "Evaluator": {**worker, "replicas": 1}}
    configs = operator_tf_configs(tfjob, namespace="ml")
    infos = {key: parse_tf_config(config) for key, config in configs.items()}
    assert infos[("chief", 0)] == ClusterInfo("chief", 0, num_workers=3, num_ps=1, has_chief_task=True)
    assert infos[("worker", 1)] == ClusterInfo("worker", 1, num_workers=3, num_ps=1, has_chief_task=True)
    assert infos[("ps", 0)].num_ps == 1 and not infos[("ps", 0)].is_chief
    assert [key for key, info in infos.items() if info.is_chief] == [("chief", 0)]
    assert infos[("evaluator", 0)].task_type == "evaluator" and not infos[("evaluator", 0)].is_chief

    from trainer.distribute.strategy import resolve_strategy

    assert auto_strategy_name(infos[("chief", 0)], 0, False) == "parameter_server"
    monkeypatch.setenv("TF_CONFIG", configs[("evaluator", 0)])
    with pytest.raises(ValueError, match=r"evaluator task.*pass validation_data to fit\(\)\. Remove the Evaluator"):
        resolve_strategy("auto")


def test_a_master_task_is_refused_with_the_fix():
    config = {"cluster": {"master": ["m:2222"], "worker": ["w:2222"]}, "task": {"type": "worker", "index": 0}}
    with pytest.raises(ValueError, match=r"'master' task.*Name it 'chief'"):
        parse_tf_config(config)


def test_the_indexed_job_gives_each_pod_its_place_under_the_headless_service(tmp_path):
    service, job = yaml.safe_load_all((MANIFESTS / "indexed-job.yaml").read_text())
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == {"job-name": "fashion-mnist"}
    pod = job["spec"]["template"]["spec"]
    assert job["spec"]["completionMode"] == "Indexed" and pod["subdomain"] == service["metadata"]["name"]
    container = pod["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"]}
    workers = job["spec"]["completions"]
    assert int(env["WORKERS"]) == workers == job["spec"]["parallelism"]
    # Run the pod's command with a `python` that prints the TF_CONFIG it was given.
    stub = tmp_path / "python"
    stub.write_text('#!/bin/sh\nprintf "%s" "$TF_CONFIG"\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    port = service["spec"]["ports"][0]["port"]
    hosts = [f"{job['metadata']['name']}-{i}.{pod['subdomain']}:{port}" for i in range(workers)]  # pods' DNS names
    for index in range(workers):
        proc = subprocess.run(container["command"] + container["args"], capture_output=True, text=True, timeout=30,
                              env={**os.environ, **env, "JOB_COMPLETION_INDEX": str(index),
                                   "PATH": f"{tmp_path}:{os.environ['PATH']}"})
        assert proc.returncode == 0, proc.stderr
        config = json.loads(proc.stdout)
        assert config["cluster"] == {"worker": hosts}
        assert parse_tf_config(config) == ClusterInfo("worker", index, num_workers=workers)
        assert auto_strategy_name(parse_tf_config(config), 0, False) == "multi_worker"


DOCKERFILE = (TESTS.parent / "Dockerfile").read_text()


def _containers() -> list[dict]:
    tfjob = yaml.safe_load((MANIFESTS / "tfjob.yaml").read_text())
    _, job = yaml.safe_load_all((MANIFESTS / "indexed-job.yaml").read_text())
    return [*tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"],
            *job["spec"]["template"]["spec"]["containers"]]


def _copied() -> list[str]:
    """The repository paths the Dockerfile copies into the image."""
    return [path for line in re.findall(r"^COPY (.+)$", DOCKERFILE, re.M) for path in line.split()[:-1]]


def test_the_manifests_run_the_image_the_dockerfile_builds_where_it_puts_the_examples():
    (tag,) = re.findall(r"docker build -t (\S+) \.", DOCKERFILE)
    (workdir,) = re.findall(r"^WORKDIR (\S+)$", DOCKERFILE, re.M)
    for container in _containers():
        assert container["image"] == tag and container["workingDir"] == workdir
        (script,) = re.findall(r"python (examples/\S+\.py)", " ".join(container["command"] + container.get("args", [])))
        assert (TESTS.parent / script).is_file() and any(script.startswith(f"{path}/") for path in _copied())


def test_the_image_installs_tensorflow_in_the_range_setup_cfg_allows():
    setup = configparser.ConfigParser()
    setup.read(TESTS.parent / "setup.cfg")
    (allowed,) = [line.strip() for line in setup["options"]["install_requires"].splitlines()
                  if line.strip().startswith("tensorflow")]
    assert '"tensorflow[and-cuda]' + allowed.removeprefix("tensorflow") + '"' in DOCKERFILE


@pytest.mark.slow  # builds a wheel: seconds
def test_the_files_the_image_copies_build_the_whole_package(tmp_path):
    for path in _copied():
        source = TESTS.parent / path
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / path)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), "."], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    setup = configparser.ConfigParser()
    setup.read(TESTS.parent / "setup.cfg")
    packages = setup["options"]["packages"].split()
    with zipfile.ZipFile(wheel) as archive:
        folders = {name.rsplit("/", 1)[0].replace("/", ".") for name in archive.namelist() if name.endswith(".py")}
    assert folders >= set(packages), set(packages) - folders
