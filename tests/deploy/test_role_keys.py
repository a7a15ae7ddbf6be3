"""One CURVE key per role in the shipped deployments (issue 23, item 2): docker-compose.yml and deploy/k8s give
each component the key of what it sends (ZMQFLOW_CURVE_KEY), and a Kubernetes pod mounts its own pair only, so a
gateway's key cannot do what the chief's does. The keys are made by the deployment's own command, for real."""

import base64
import os

import pytest
import yaml
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.common.rpc import encryption as curve
from zmqflow.jobs.k8s import render
from zmqflow.jobs.spec import DEPLOYMENT, job_spec
from tests.deploy.test_k8s_manifests import documents, pod_templates

pytestmark = pytest.mark.unit

# compose service -> its key: the chief inits, restores and shuts down (admin); the other workers and the reader
# move the job's data and variables (member); everyone else sends client ops only (serving)
COMPOSE_KEYS = {"broker": "serving", "ps0": "serving", "ps1": "serving", "reader": "member", "worker0": "admin",
                "worker1": "member", "serve0": "serving", "serve1": "serving", "serve2": "serving",
                "aggregator": "serving", "gateway": "serving", "loadtest": "serving", "loadtest-http": "serving",
                "dashboard": "serving", "keys": None, "data": None}
# Kubernetes pod template -> (its key, whether it is a ZeroMQ server)
K8S_KEYS = {"broker": ("serving", True), "ps": ("serving", True), "chief": ("admin", False),
            "worker": ("member", False), "reader": ("member", False), "serve0": ("serving", True),
            "serve1": ("serving", True), "serve2": ("serving", True), "aggregator": ("serving", True),
            "gateway": ("serving", False), "zmqflow-train/PS": ("serving", True),
            "zmqflow-train/Chief": ("admin", False), "zmqflow-train/Worker": ("member", False),
            "zmqflow-ps-training/ps": ("serving", True), "zmqflow-ps-training/chief": ("admin", False),
            "zmqflow-ps-training/worker": ("member", False)}
ROLES = {"member": {"member", "client"}, "serving": {"client"}, "admin": {"client", "member", "admin"}}


def test_each_compose_service_dials_with_the_key_of_its_role(project):
    assert set(project.services) == set(COMPOSE_KEYS)
    for name, service in project.services.items():
        assert service.environment.get(curve.KEY_ENV) == COMPOSE_KEYS[name], name


def test_the_compose_keys_service_makes_one_key_per_role_and_adds_them_to_older_keys(project, tmp_path):
    """Its command, run for real: the role keys with their roles; on a volume from before roles (the default
    client pair only) --keep keeps that pair and adds the role keys, so an upgraded deployment starts."""
    keys = tmp_path / "keys"
    argv = [str(keys) if a == "/keys" else a for a in project.services["keys"].command[1:]]
    first = CliRunner().invoke(main, argv)
    assert first.exit_code == 0, first.output
    for key, roles in ROLES.items():
        assert set(curve.recorded_roles(str(keys / "authorized" / f"{key}.key"))) == roles, key
        curve.ClientKeys(str(keys), key)
    older = tmp_path / "older"
    curve.generate(str(older))
    client = (older / "client.key_secret").read_bytes()
    again = CliRunner().invoke(main, [str(older) if a == str(keys) else a for a in argv])
    assert again.exit_code == 0, again.output
    assert again.output.strip() == f"keeping the keys in {older}; added member, serving, admin"
    assert (older / "client.key_secret").read_bytes() == client
    assert {n for n in os.listdir(older / "authorized")} == {"client.key", "member.key", "serving.key", "admin.key"}


def secret_items(template):
    [volume] = [v for v in template["spec"]["volumes"] if v.get("secret", {}).get("secretName") == render.CURVE_SECRET]
    return [item["path"] for item in volume["secret"]["items"]]


@pytest.mark.parametrize("tfjob", [False, True], ids=["statefulsets", "tfjob"])
def test_each_pod_mounts_its_own_key_pair_only(tfjob, tmp_path):
    """No pod holds another role's secret key; a server holds the server pair and the role keys it accepts. The
    files laid out as the kubelet does load for real: the pod's pair, the servers' key, a server's ZAP list."""
    files = render.generate_curve_files()
    docs = render.manifests(render.Options(job_spec(DEPLOYMENT, ps=2, workers=3), tfjob=tfjob), files)
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    templates = dict(pod_templates({(d["kind"], d["metadata"]["name"]): d for d in docs}))
    assert set(templates) == {n for n in K8S_KEYS if n.startswith("zmqflow-train/") == tfjob and
                              not n.startswith("zmqflow-ps-training/") or n in
                              ("broker", "reader", "serve0", "serve1", "serve2", "aggregator", "gateway")}
    for name, template in templates.items():
        key, server = K8S_KEYS[name]
        main_container = template["spec"]["containers"][0]
        assert {e["name"]: e.get("value") for e in main_container["env"]}[curve.KEY_ENV] == key, name
        items = secret_items(template)
        secrets = {path for path in items if path.endswith("_secret")}
        assert secrets == {f"{key}.key_secret", *(["server.key_secret"] if server else [])}, name
        for init in template["spec"].get("initContainers", []):
            assert "volumeMounts" not in init or all(m["name"] != "curve" for m in init["volumeMounts"]), name
        pod = tmp_path / name.replace("/", "-")
        for path in items:
            (pod / path).parent.mkdir(parents=True, exist_ok=True)
            (pod / path).write_bytes(base64.b64decode(secret["data"][path.replace("/", "-")]))
        mine = curve.ClientKeys(str(pod), key)
        if server:
            assert curve.ServerKeys(str(pod)).public == mine.server_public
            assert sorted(os.listdir(pod / "authorized")) == ["admin.key", "member.key", "serving.key"]
            for role_key, roles in ROLES.items():
                assert set(curve.recorded_roles(str(pod / "authorized" / f"{role_key}.key"))) == roles
        else:
            assert not (pod / "authorized").exists(), name


def test_the_shipped_manifests_name_each_pods_key():
    """deploy/k8s (no Secret there): the same keys and items as rendered with keys."""
    for name, template in pod_templates(documents()):
        key, server = K8S_KEYS[name]
        main_container = template["spec"]["containers"][0]
        assert {e["name"]: e.get("value") for e in main_container["env"]}[curve.KEY_ENV] == key, name
        assert {p for p in secret_items(template) if p.endswith("_secret")} == {
            f"{key}.key_secret", *(["server.key_secret"] if server else [])}, name


def test_without_curve_no_pod_names_a_key():
    docs = render.manifests(render.Options(curve=False))
    for name, template in pod_templates({(d["kind"], d["metadata"]["name"]): d for d in docs}):
        assert curve.KEY_ENV not in yaml.safe_dump(template), name
