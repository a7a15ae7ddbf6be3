"""deploy/k8s: well-formed, and the same cluster, ports and commands as docker-compose.yml."""

import glob
import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from zmqflow.common.cluster import ClusterSpec
from tests.deploy.conftest import K8S

pytestmark = pytest.mark.unit

# Kubernetes host -> compose service name
HOSTS = {"ps-0.ps": "ps0", "ps-1.ps": "ps1", "worker-0.worker": "worker0", "worker-1.worker": "worker1"}


def documents():
    docs = {}
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc:
                    assert {"apiVersion", "kind", "metadata"} <= set(doc), path
                    docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def container(doc):
    return doc["spec"]["template"]["spec"]["containers"][0]


def compose_hosts(argv):
    """argv with Kubernetes host names renamed to the compose ones."""
    pattern = re.compile("|".join(re.escape(h) for h in HOSTS))
    return [pattern.sub(lambda m: HOSTS[m.group(0)], arg) for arg in argv]


def test_manifests_are_the_expected_objects():
    docs = documents()
    for kind, name in [("StatefulSet", "ps"), ("StatefulSet", "worker"), ("Service", "ps"), ("Service", "worker"),
                       ("Deployment", "broker"), ("Deployment", "reader"), ("Deployment", "aggregator"),
                       ("Deployment", "serve0"), ("Deployment", "serve2"), ("ConfigMap", "zmqflow-cluster"),
                       ("TFJob", "zmqflow-mnist")]:
        assert (kind, name) in docs, (kind, name)
    for (kind, name), doc in docs.items():
        if kind in ("Deployment", "StatefulSet"):
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
            assert doc["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_cluster_config_map_matches_compose_and_headless_services(project):
    docs = documents()
    cluster = ClusterSpec(json.loads(docs[("ConfigMap", "zmqflow-cluster")]["data"]["cluster.json"]))
    cluster.validate(require_dense=True)
    compose_tf = json.loads(project.services["ps0"].environment["TF_CONFIG"])["cluster"]
    assert cluster.resolve_hosts(HOSTS) == ClusterSpec(compose_tf)
    for job in ("ps", "worker"):
        service, stateful = docs[("Service", job)], docs[("StatefulSet", job)]
        assert service["spec"]["clusterIP"] == "None" and stateful["spec"]["serviceName"] == job
        assert stateful["spec"]["replicas"] == cluster.num_tasks(job)
        ports = sorted(p["port"] for p in service["spec"]["ports"])
        assert ports == sorted(int(a.rsplit(":", 1)[1]) for a in cluster.job_tasks(job))
        for i, address in enumerate(cluster.job_tasks(job)):
            assert address.split(":")[0] == f"{job}-{i}.{job}"   # the StatefulSet's stable pod names


def test_same_commands_and_ports_as_compose(project):
    docs = documents()
    pairs = {"ps0": ("StatefulSet", "ps"), "worker0": ("StatefulSet", "worker"), "worker1": ("StatefulSet", "worker"),
             "broker": ("Deployment", "broker"), "reader": ("Deployment", "reader"),
             "aggregator": ("Deployment", "aggregator"), "serve0": ("Deployment", "serve0"),
             "serve1": ("Deployment", "serve1"), "serve2": ("Deployment", "serve2")}
    for name, key in pairs.items():
        assert compose_hosts(container(docs[key])["args"]) == project.services[name].command, name
        if key[0] == "Deployment" and ("Service", key[1]) in docs:
            ports = [p["port"] for p in docs[("Service", key[1])]["spec"]["ports"]]
            assert ports == project.services[name].expose, name
    for job in ("ps", "worker"):
        assert container(docs[("StatefulSet", job)])["command"] == ["sh", "/etc/zmqflow/entrypoint.sh"]


def test_reader_init_container_writes_the_shards_it_reads(project):
    spec = documents()[("Deployment", "reader")]["spec"]["template"]["spec"]
    init = spec["initContainers"][0]
    assert init["args"] == project.services["data"].command
    out = init["args"][init["args"].index("--out") + 1]
    mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    assert {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]} == mounts
    assert out in mounts.values() and f"{out}/*.bin" in container({"spec": {"template": {"spec": spec}}})["args"]
    assert {v["name"] for v in spec["volumes"]} == set(mounts)


def test_tfjob_runs_the_compose_commands(project):
    spec = documents()[("TFJob", "zmqflow-mnist")]["spec"]["tfReplicaSpecs"]
    for replica, name in (("PS", "ps0"), ("Worker", "worker0")):
        main = spec[replica]["template"]["spec"]["containers"][0]
        assert main["name"] == "tensorflow"                # the container the operator gives TF_CONFIG
        assert main["args"] == project.services[name].command
        assert main["ports"][0]["name"] == "tfjob-port"
        assert spec[replica]["replicas"] == 2


def test_entry_snippet_builds_tf_config_from_the_pod_name(tmp_path):
    data = documents()[("ConfigMap", "zmqflow-cluster")]["data"]
    (tmp_path / "cluster.json").write_text(data["cluster.json"])
    script = tmp_path / "entrypoint.sh"
    script.write_text(data["entrypoint.sh"].replace("/etc/zmqflow", str(tmp_path)))
    for pod, job, index in (("ps-1", "ps", 1), ("worker-0", "worker", 0)):
        out = subprocess.run(["sh", str(script), sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"],
                             env={**os.environ, "POD_NAME": pod}, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        task = ClusterSpec.from_tf_config({"TF_CONFIG": out.stdout})
        assert (task.task_type, task.task_index) == (job, index)
        assert task.address == f"{pod}.{job}:{(5600 if job == 'ps' else 5610) + index}"


def pod_templates(docs):
    for (kind, name), doc in docs.items():
        if kind in ("Deployment", "StatefulSet"):
            yield name, doc["spec"]["template"]
        elif kind == "TFJob":
            for replica, spec in doc["spec"]["tfReplicaSpecs"].items():
                yield f"{name}/{replica}", spec["template"]


def test_every_pod_is_scraped_by_prometheus_on_its_metrics_port():
    for name, template in pod_templates(documents()):
        main = template["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in main.get("env", [])}
        flag = (main["args"][main["args"].index("--metrics-port") + 1] if "--metrics-port" in main["args"]
                else env.get("ZMQFLOW_METRICS_PORT"))
        host, port = flag.split(":")
        assert host == "0.0.0.0", name                      # reachable from the Prometheus pod
        annotations = template["metadata"]["annotations"]
        assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": port}, name
        assert {"name": "metrics", "containerPort": int(port)} in main["ports"], name
