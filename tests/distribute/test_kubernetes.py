"""The Kubernetes manifests in examples/kubernetes: the TF_CONFIG each pod gets, read by trainer/distribute/cluster.py,
the objects checked against Kubernetes's schemas, and the volume the runs and the backup live on.

For the TFJob, TF_CONFIG is made as Kubeflow's training operator makes it
(`genClusterSpec` and `genTFConfigJSONStr` in its tensorflow controller: each
replica type lowercased, `<job>-<type>-<index>.<namespace>.svc:<tfjob-port>`,
the Evaluator left out of the cluster, "environment": "cloud"). For the
Indexed Job, the pod's own command is run with each completion index.

The schemas are those the kubernetes-validate package ships (the test extra), one set per Kubernetes
minor version (1.25 to 1.37 in its 1.37.0), read from the installed package: no network. Strict mode refuses a field
the schema does not name, so a misspelled field fails as a wrong type does. They check the fields'
names, types and a few enums; not what only the API server checks (names as DNS labels, a claim's
storage class, quantities' syntax, immutable fields), nor anything a controller does. The TFJob is
Kubeflow's custom resource, with no schema there: each replica's pod template is checked as a
PodTemplate, and the few TFJob fields around it against the training operator's v1 API by hand.
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

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from conftest import TESTS
from trainer.distribute.cluster import BACKUP_DIR_ENV, ClusterInfo, parse_tf_config
from trainer.distribute.strategy import auto_strategy_name

MANIFESTS = TESTS.parent / "examples" / "kubernetes"
FILES = ("indexed-job.yaml", "tfjob.yaml")


def documents(name: str, text: str | None = None) -> dict[str, dict]:
    """The manifest's objects by kind (one of each); `text` stands for the file's."""
    objects = list(yaml.safe_load_all((MANIFESTS / name).read_text() if text is None else text))
    kinds = {item["kind"]: item for item in objects}
    assert len(kinds) == len(objects), f"{name}: two objects of one kind"
    return kinds


def _pod_templates(name: str) -> list[dict]:
    """The pod templates of the manifest's workload: the Job's, or each TFJob replica's."""
    objects = documents(name)
    if "TFJob" in objects:
        return [spec["template"] for spec in objects["TFJob"]["spec"]["tfReplicaSpecs"].values()]
    return [objects["Job"]["spec"]["template"]]


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
    tfjob = documents("tfjob.yaml")["TFJob"]
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
    tfjob = documents("tfjob.yaml")["TFJob"]
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
    objects = documents("indexed-job.yaml")
    service, job = objects["Service"], objects["Job"]
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


KUBERNETES_VERSIONS = list(dict.fromkeys(all_versions()))  # every minor version the validator has schemas for
# The TFJob's own fields, as the training operator's kubeflow.org/v1 API names them (TFJobSpec, ReplicaSpec).
TFJOB_SPEC_FIELDS = {"runPolicy", "successPolicy", "tfReplicaSpecs", "enableDynamicWorker"}
REPLICA_TYPES = {"Chief", "Master", "Worker", "PS", "Evaluator"}
REPLICA_SPEC_FIELDS = {"replicas", "template", "restartPolicy"}
RESTART_POLICIES = {"Always", "OnFailure", "Never", "ExitCode"}


def check_against_the_schemas(name: str, text: str | None = None) -> None:
    """Every object of the manifest, on every Kubernetes version; raises kubernetes_validate.ValidationError
    (a schema's) or ValueError (a TFJob field the operator does not name)."""
    checked = []
    for kind, item in documents(name, text).items():
        if kind != "TFJob":
            checked.append(item)
            continue
        assert item["apiVersion"] == "kubeflow.org/v1", item["apiVersion"]
        spec = item["spec"]
        unknown = set(spec) - TFJOB_SPEC_FIELDS or set(spec["tfReplicaSpecs"]) - REPLICA_TYPES
        if unknown:
            raise ValueError(f"TFJob: unknown field or replica type {sorted(unknown)}")
        for rtype, replica in spec["tfReplicaSpecs"].items():
            if set(replica) - REPLICA_SPEC_FIELDS or replica.get("restartPolicy", "Never") not in RESTART_POLICIES \
                    or type(replica["replicas"]) is not int or replica["replicas"] < 1:
                raise ValueError(f"TFJob: replica {rtype} is not a ReplicaSpec: {sorted(replica)}")
            checked.append({"apiVersion": "v1", "kind": "PodTemplate",
                            "metadata": {"name": f"{item['metadata']['name']}-{rtype.lower()}"},
                            "template": replica["template"]})
    for version in KUBERNETES_VERSIONS:
        for item in checked:
            kubernetes_validate.validate(item, version, strict=True)


@pytest.mark.parametrize("name", FILES)
def test_every_object_of_the_manifests_fits_kubernetes_schemas(name):
    assert KUBERNETES_VERSIONS, "kubernetes-validate ships no schemas"
    check_against_the_schemas(name)


@pytest.mark.parametrize("name, old, new, error", [
    ("indexed-job.yaml", "volumeMounts:", "volumMounts:", r"'volumMounts' was unexpected"),
    ("indexed-job.yaml", "accessModes:", "accessMode:", r"'accessMode' was unexpected"),
    ("indexed-job.yaml", "completions: 2", 'completions: "2"', r"'2' is not of type 'integer'"),
    ("tfjob.yaml", "containerPort: 2222", 'containerPort: "2222"', r"'2222' is not of type 'integer'"),
    ("tfjob.yaml", "mountPath: /runs", "mountpath: /runs", r"'mountPath' is a required property"),
    ("tfjob.yaml", "restartPolicy: OnFailure", "restartPolicy: OnFail", r"replica Worker is not a ReplicaSpec"),
    ("tfjob.yaml", "tfReplicaSpecs:", "tfReplicaSpec:", r"unknown field or replica type \['tfReplicaSpec'\]"),
])
def test_a_broken_manifest_is_refused(name, old, new, error):
    text = (MANIFESTS / name).read_text()
    assert text.count(old) == 1, old
    with pytest.raises((kubernetes_validate.ValidationError, ValueError)) as caught:
        check_against_the_schemas(name, text.replace(old, new))
    error_of_a_schema = isinstance(caught.value, kubernetes_validate.ValidationError)
    message = caught.value.message if error_of_a_schema else str(caught.value)
    assert re.search(error, message), message


def test_each_manifest_writes_its_runs_and_its_backup_on_a_claim_of_its_own():
    claims = {name: documents(name)["PersistentVolumeClaim"] for name in FILES}
    assert len({claim["metadata"]["name"] for claim in claims.values()}) == len(FILES)  # deleting one leaves the other
    for name, claim in claims.items():
        assert claim["spec"]["accessModes"] == ["ReadWriteMany"]  # every pod mounts it, on whichever node it runs
        for template in _pod_templates(name):
            volumes = {volume["name"]: volume for volume in template["spec"]["volumes"]}
            for container in template["spec"]["containers"]:
                on_claim = [mount["mountPath"] for mount in container["volumeMounts"]
                            if volumes[mount["name"]].get("persistentVolumeClaim", {}).get("claimName")
                            == claim["metadata"]["name"]]
                env = {item["name"]: item["value"] for item in container["env"]}
                (out,) = re.findall(r"--out (\S+)", " ".join(container["command"] + container.get("args", [])))
                for path in (out, env[BACKUP_DIR_ENV]):  # the example's outputs; where fit backs up and resumes
                    assert any(path.startswith(f"{mount}/") for mount in on_claim), (name, path, on_claim)


DOCKERFILE = (TESTS.parent / "Dockerfile").read_text()


def _containers() -> list[dict]:
    return [container for name in FILES for template in _pod_templates(name)
            for container in template["spec"]["containers"]]


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
