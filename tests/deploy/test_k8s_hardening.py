"""The manifests' hardening (docs/security.md), checked on what the renderer makes and what deploy/k8s ships.

checkov is not a dependency, so these are its checks that matter here, as assertions: a namespace of the job's
own with the restricted Pod Security Standard; in every pod no service-account token, the runtime's seccomp
profile, a read-only root filesystem with bounded scratch directories, cpu and memory limits; a NetworkPolicy
that lets in only the flows the job's commands make; the gateway without a server's secret key; the image-digest
checks skipped inline (with the reason) only while the image has no digest.
"""

import base64
import glob
import json
import os
import re

import pytest
import yaml

from zmqflow.common.cluster.spec import ClusterSpec
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.rpc import encryption as curve
from zmqflow.jobs.k8s import render
from tests.deploy.conftest import K8S
from tests.deploy.test_k8s_render import MODES, options, pod_templates, rendered

pytestmark = pytest.mark.unit

DIGEST = "registry.example/zmqflow@sha256:" + "0123456789abcdef" * 4
VARIANTS = [dict(tfjob=False), dict(tfjob=True), dict(tfjob=False, namespace="ml-team", image=DIGEST),
            dict(trainjob=True)]


def shipped(tfjob=False, trainjob=False):
    """deploy/k8s's objects as applied: tfjob.yaml or trainjob.yaml instead of ps.yaml and worker.yaml."""
    chosen = "tfjob.yaml" if tfjob else "trainjob.yaml" if trainjob else None
    skipped = {"ps.yaml", "worker.yaml", "tfjob.yaml", "trainjob.yaml"} - {chosen} if chosen else {"tfjob.yaml",
                                                                                                 "trainjob.yaml"}
    docs = []
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        if os.path.basename(path) not in skipped | {"curve.yaml"}:
            with open(path, encoding="utf-8") as f:
                docs += [doc for doc in yaml.safe_load_all(f) if doc]
    return docs


def all_docs(curve_files=None, **kwargs):
    return rendered(2, 3, curve_files, **kwargs)


def workloads(docs):
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "Job", "TFJob", "TrainingRuntime")]


@pytest.fixture(scope="module")
def curve_files():
    return render.generate_curve_files()


@pytest.mark.parametrize("variant", VARIANTS, ids=["jobs", "tfjob", "digest", "trainjob"])
def test_every_pod_runs_locked_down(variant):
    templates = list(pod_templates(all_docs(**variant)))
    assert len(templates) == 10   # broker, reader, 3 model servers, aggregator, gateway; ps, chief, workers
    for name, template in templates:
        spec = template["spec"]
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec.get("initContainers", []) + spec["containers"]:
            security = c["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
            assert security["runAsNonRoot"] is True
            for kind in ("requests", "limits"):
                assert set(c["resources"][kind]) == {"cpu", "memory"}, (name, c["name"], kind)
            assert c["image"] == variant.get("image", render.DEFAULT_IMAGE)
            assert c["imagePullPolicy"] == "IfNotPresent"
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            for path in ("/tmp", render.HOME):   # what a read-only root still lets it write: bounded emptyDirs
                assert volumes[mounts[path]]["emptyDir"]["sizeLimit"], (name, c["name"], path)


@pytest.mark.parametrize("variant", VARIANTS, ids=["jobs", "tfjob", "digest", "trainjob"])
def test_every_object_is_in_the_jobs_namespace_which_enforces_the_restricted_standard(variant):
    docs = all_docs(**variant)
    namespace = variant.get("namespace", render.DEFAULT_NAMESPACE)
    [ns] = [d for d in docs if d["kind"] == "Namespace"]
    assert docs[0] is ns and ns["metadata"]["name"] == namespace
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {d["metadata"]["namespace"] for d in docs if d is not ns} == {namespace}
    assert "default" not in {d["metadata"].get("namespace") for d in shipped()}


def test_the_namespace_is_a_dns_label():
    for bad in ("", "Ml", "a_b", "x" * 64, None):
        with pytest.raises(InvalidArgumentError, match="namespace"):
            options(namespace=bad)


def test_the_image_has_a_version_tag_and_the_digest_checks_are_skipped_inline_only_without_a_digest():
    """checkov reads `checkov.io/skip<n>: CHECK=reason` (split at "="): the reason holds none."""
    assert render.DEFAULT_IMAGE.split(":")[-1] not in ("", "latest") and "@" not in render.DEFAULT_IMAGE
    for docs in (all_docs(), all_docs(tfjob=True), all_docs(trainjob=True), shipped(), shipped(tfjob=True),
                 shipped(trainjob=True)):
        for doc in workloads(docs):
            annotations = doc["metadata"]["annotations"]
            skipped = dict(value.split("=") for key, value in annotations.items() if key.startswith("checkov.io/skip"))
            assert sorted(skipped) == ["CKV_K8S_15", "CKV_K8S_43"], doc["metadata"]["name"]
            assert all(len(reason) > 40 for reason in skipped.values())
    for doc in workloads(all_docs(image=DIGEST)):
        assert "annotations" not in doc["metadata"], doc["metadata"]["name"]


# ------------------------------------------------------------------ NetworkPolicy

_ENDPOINT = re.compile(r"tcp://([a-z0-9.-]+):(\d+)")


def _dialled(container, ps_addresses):
    """(host, port) every connection of a container's command goes to: its tcp:// options, and for a worker
    the ps shards of its TF_CONFIG."""
    found = [(host, int(port)) for arg in container["args"] for host, port in _ENDPOINT.findall(arg)
             if not host[0].isdigit()]   # not its own binds (0.0.0.0)
    if container["args"][0] == "worker":
        found += [(address.rsplit(":", 1)[0], int(address.rsplit(":", 1)[1])) for address in ps_addresses]
    return found


def _admits(policy, source_labels, port, target_container):
    """Whether `policy` lets a pod with `source_labels` reach `port` (a number) of `target_container`."""
    names = {p["name"]: p["containerPort"] for p in target_container.get("ports", [])}
    for rule in policy["spec"]["ingress"]:
        ports = [names.get(p["port"], p["port"]) for p in rule["ports"]]
        sources = [s["podSelector"]["matchLabels"] for s in rule.get("from", [])]
        if port in ports and (not sources or any(s.items() <= source_labels.items() for s in sources)):
            return True
    return False


def _policies_of(docs, labels):
    return [d for d in docs if d["kind"] == "NetworkPolicy"
            and d["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]


@pytest.mark.parametrize("docs", [shipped, lambda: shipped(tfjob=True), lambda: shipped(trainjob=True),
                                  lambda: all_docs(), lambda: all_docs(tfjob=True), lambda: all_docs(trainjob=True)],
                         ids=["deploy-k8s", "deploy-k8s-tfjob", "deploy-k8s-trainjob", "jobs", "tfjob", "trainjob"])
def test_every_pod_has_a_network_policy_that_admits_its_jobs_flows_and_no_other_pod(docs):
    docs = docs()
    templates = dict(pod_templates(docs))
    cluster = ClusterSpec(json.loads(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["cluster.json"]))
    selectors = {d["metadata"]["name"]: d["spec"]["selector"] for d in docs if d["kind"] == "Service"}
    tfjob = "zmqflow-train/PS" in templates
    if tfjob:   # the operator's Service per replica, on the port named tfjob-port, in the TF_CONFIG it sets
        ps_replicas = next(d for d in docs if d["kind"] == "TFJob")["spec"]["tfReplicaSpecs"]["PS"]["replicas"]
        ps_addresses = [f"zmqflow-train-ps-{i}:5600" for i in range(ps_replicas)]
        selectors.update({f"zmqflow-train-ps-{i}": {"app": "zmqflow", "job": "ps"} for i in range(ps_replicas)})
    elif "zmqflow-ps-training/ps" in templates:   # the JobSet's pod names, from the TrainJob's cluster spec
        data = next(d for d in docs if d["kind"] == "ConfigMap")["data"]
        ps_addresses = ClusterSpec(json.loads(data[render.TRAINJOB_CLUSTER])).job_tasks("ps")
        selectors.update({a.split(".")[0]: {"app": "zmqflow", "job": "ps"} for a in ps_addresses})
    else:
        ps_addresses = cluster.job_tasks("ps")
    for name, template in templates.items():
        [policy] = _policies_of(docs, template["metadata"]["labels"])
        assert policy["spec"]["policyTypes"] == ["Ingress"], name
        main = template["spec"]["containers"][0]
        metrics = int(template["metadata"]["annotations"]["prometheus.io/port"])
        assert _admits(policy, {"app": "prometheus"}, metrics, main), name      # scraped from anywhere
    flows = 0
    for name, template in templates.items():
        source = template["metadata"]["labels"]
        for host, port in _dialled(template["spec"]["containers"][0], ps_addresses):
            selector = selectors.get(host.split(".")[0]) or selectors[host.split(".")[-1]]   # ps-1.ps: Service ps
            [target] = {json.dumps(t["metadata"]["labels"], sort_keys=True): t for t in templates.values()
                        if selector.items() <= t["metadata"]["labels"].items()}.values()
            [policy] = _policies_of(docs, target["metadata"]["labels"])
            assert _admits(policy, source, port, target["spec"]["containers"][0]), (name, host, port)
            assert not _admits(policy, {"app": "zmqflow", "job": "intruder"}, port,
                               target["spec"]["containers"][0]), (host, port)
            flows += 1
    assert flows >= 8   # workers -> broker, ps; reader -> broker; aggregator -> serve*; gateway -> aggregator


@pytest.mark.parametrize("tfjob", [False, True], ids=["jobs", "tfjob"])
def test_the_policies_name_exactly_these_flows(tfjob):
    """Who may connect to whom, beyond Prometheus on `metrics`: the table docs/security.md shows."""
    docs = all_docs(tfjob=tfjob)
    allowed = {}
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        role = policy["spec"]["podSelector"]["matchLabels"]["job"]
        for rule in policy["spec"]["ingress"]:
            if [p["port"] for p in rule["ports"]] != ["metrics"]:
                allowed[role] = sorted(s["podSelector"]["matchLabels"]["job"] for s in rule.get("from", [])) or "any"
    assert allowed == {"broker": ["chief", "reader", "worker"], "ps": ["chief", "worker"],
                       "serve": ["aggregator", "gateway"],
                       "aggregator": ["gateway"], "gateway": "any"}
    _, policy = render.network_policy(options(), "ps", [5600, 5601])
    assert [p["port"] for p in policy["spec"]["ingress"][0]["ports"]] == [5600, 5601]


# ------------------------------------------------------------------ CURVE keys per pod


def test_the_gateway_pod_holds_a_clients_keys_and_no_servers_secret(curve_files, tmp_path):
    """Laid out as the kubelet does, the gateway's files make a CURVE client of the servers' key, and no server."""
    docs = all_docs(curve_files)
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    templates = dict(pod_templates(docs))
    for name, template in templates.items():
        [volume] = [v for v in template["spec"]["volumes"] if "secret" in v]
        paths = {item["path"] for item in volume["secret"]["items"]}
        assert paths <= {render._secret_key(p).replace("-", "/") for p in render.curve_file_names()}
        servers = {"broker", "ps", "serve0", "serve1", "serve2", "aggregator"}   # the chief, workers, reader dial out
        assert ("server.key_secret" in paths) == (name in servers), name
    [volume] = [v for v in templates["gateway"]["spec"]["volumes"] if "secret" in v]
    for item in volume["secret"]["items"]:
        path = tmp_path / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(secret["data"][item["key"]]))
    client = curve.ClientKeys(str(tmp_path), "serving")
    assert client.server_public and client.secret
    with pytest.raises(InvalidArgumentError, match="server.key_secret is missing"):
        curve.ServerKeys(str(tmp_path))
