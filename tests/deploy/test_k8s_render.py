"""`zmqflow k8s render`: the manifests for any ps/worker count, checked against the Kubernetes API schemas offline.

kubernetes-validate bundles the OpenAPI schemas of each Kubernetes release as JSON schemas; strict mode
also refuses fields the API does not know. The custom resources are not in it:
- the TFJob (kubeflow.org/v1): each replica's pod template is validated as a core/v1 PodTemplate, and the
  TFJob's own fields are checked here;
- Trainer v2's TrainJob and TrainingRuntime (trainer.kubeflow.org/v1alpha1): against their CRDs' schemas
  (tests/deploy/schemas/, from kubeflow/trainer v2.3.0, the replicated Jobs' templates pruned) with unknown
  fields refused, and each replicated Job's template as a batch/v1 Job;
- the ServiceMonitor (monitoring.coreos.com/v1): its CRD's schema is not vendored here (skipped); the fields
  it uses are checked by hand.
"""

import base64
import copy
import glob
import json
import os
import stat
import subprocess
import sys

import click
import pytest
import yaml
from click.testing import CliRunner

import kubernetes_validate
from kubernetes_validate.utils import all_versions

from zmqflow.common.rpc import encryption as curve
from zmqflow.common.processes import metrics
from zmqflow.common.processes.service_cli import METRICS_BIND_ENV
from zmqflow.common.cluster.spec import ClusterSpec
from zmqflow.cli.k8s import k8s
from zmqflow.jobs.k8s import render
from zmqflow.jobs.spec import DEPLOYMENT, job_spec

pytestmark = pytest.mark.unit

K8S_VERSION = "1.30.0"
SCHEMAS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schemas")
MODES = {"jobs": {}, "tfjob": {"tfjob": True}, "trainjob": {"trainjob": True}}   # how the training tasks run
SIZES = [(2, 4), (4, 8)]
UID = 10001


@pytest.fixture(scope="module")
def curve_files():
    return render.generate_curve_files()


def options(ps=2, workers=2, image=render.DEFAULT_IMAGE, namespace=render.DEFAULT_NAMESPACE, curve=True, tfjob=False,
            trainjob=False, **spec):
    """render.Options of the shipped job resized: `spec` by job_spec's flat names (serve: its replicas)."""
    if "serve" in spec:
        spec["replicas"] = spec.pop("serve")
    return render.Options(job_spec(DEPLOYMENT, ps=ps, workers=workers, **spec), image=image, namespace=namespace,
                          curve=curve, tfjob=tfjob, trainjob=trainjob)


def rendered(ps, workers, curve_files=None, **kwargs):
    return render.manifests(options(ps, workers, curve=curve_files is not None, **kwargs), curve_files)


def by_key(docs):
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def pod_templates(docs):
    """(name, pod template) of every workload, the TFJob's replicas and the TrainingRuntime's Jobs included."""
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield doc["metadata"]["name"], doc["spec"]["template"]
        elif doc["kind"] == "TFJob":
            for replica, spec in doc["spec"]["tfReplicaSpecs"].items():
                yield f"{doc['metadata']['name']}/{replica}", spec["template"]
        elif doc["kind"] == "TrainingRuntime":
            for job in doc["spec"]["template"]["spec"]["replicatedJobs"]:
                yield f"{doc['metadata']['name']}/{job['name']}", job["template"]["spec"]["template"]


def validate(doc):
    return kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def as_pod_template(name, template):
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template}


def check_tfjob(doc, ps, workers):
    """The TFJob's own fields (kubeflow.org/v1), then each replica's pod template against core/v1."""
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "TFJob"
    replicas = doc["spec"]["tfReplicaSpecs"]
    assert set(replicas) == {"PS", "Chief", "Worker"}   # the chief its own replica type: its pod alone holds admin
    for key, count in (("PS", ps), ("Chief", 1), ("Worker", workers - 1)):
        spec = replicas[key]
        assert spec["replicas"] == count and isinstance(spec["replicas"], int)
        assert spec["restartPolicy"] in ("Always", "OnFailure", "Never", "ExitCode")
        assert spec["restartPolicy"] == "OnFailure"   # exit 3 (a peer lost) restarts the pod
        main = spec["template"]["spec"]["containers"][0]
        assert main["name"] == "tensorflow" and main["ports"][0]["name"] == "tfjob-port"
        validate(as_pod_template(f"tfjob-{key.lower()}", spec["template"]))
    assert doc["spec"]["runPolicy"]["backoffLimit"] >= 0


def crd_schema(kind):
    """The vendored CRD schema of `kind`, strict as `kubectl apply --validate=strict`: an object with properties
    and no x-kubernetes-preserve-unknown-fields refuses fields it does not list."""
    def strict(node):
        if isinstance(node, dict):
            node = {k: strict(v) for k, v in node.items()}
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
        elif isinstance(node, list):
            node = [strict(v) for v in node]
        return node
    with open(os.path.join(SCHEMAS, f"{kind}.json"), encoding="utf-8") as f:
        return strict(json.load(f)["schema"])


def check_trainjob(doc, ps=None, workers=None):
    """A TrainJob or TrainingRuntime against its CRD's schema; the runtime's replicated Jobs as batch/v1 Jobs."""
    import jsonschema
    assert doc["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    jsonschema.validate(doc, crd_schema(doc["kind"]))
    if doc["kind"] == "TrainJob":
        assert doc["spec"]["runtimeRef"] == {"name": render.TRAINING_RUNTIME, "apiGroup": "trainer.kubeflow.org",
                                             "kind": "TrainingRuntime"}
        return
    jobs = {j["name"]: j for j in doc["spec"]["template"]["spec"]["replicatedJobs"]}
    if ps is not None:
        counts = {"ps": ps, "chief": 1, **({"worker": workers - 1} if workers > 1 else {})}
        assert {name: j["template"]["spec"]["completions"] for name, j in jobs.items()} == counts
    for name, job in jobs.items():
        assert job["replicas"] == 1 and job["template"]["spec"]["completionMode"] == "Indexed", name
        assert job["template"]["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure", name
        validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, **job["template"].get(
            "metadata", {})}, "spec": job["template"]["spec"]})


def check_service_monitor(doc, namespace=render.DEFAULT_NAMESPACE):
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc["spec"]) == {"jobLabel", "selector", "namespaceSelector", "endpoints"}
    assert doc["spec"]["selector"] == {"matchLabels": {"app": "zmqflow"}}
    assert doc["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    assert doc["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]


def check(doc, ps, workers):
    """Every document of a rendering, each the way its kind can be checked (the module's docstring)."""
    if doc["kind"] == "TFJob":
        check_tfjob(doc, ps, workers)
    elif doc["kind"] in ("TrainJob", "TrainingRuntime"):
        check_trainjob(doc, ps, workers)
    elif doc["kind"] == "ServiceMonitor":
        check_service_monitor(doc)
    else:
        assert validate(doc) == "1.30", (doc["kind"], doc["metadata"]["name"])


# ------------------------------------------------------------------ the API schemas


def test_the_validator_bundles_the_version_used_here():
    assert K8S_VERSION in all_versions()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_curve", [False, True], ids=["plain", "curve"])
@pytest.mark.parametrize("ps,workers", SIZES)
def test_rendered_manifests_pass_the_kubernetes_schemas(ps, workers, with_curve, mode, curve_files):
    docs = rendered(ps, workers, curve_files if with_curve else None, **MODES[mode])
    kinds = [d["kind"] for d in docs]
    assert ("TFJob" in kinds) == (mode == "tfjob") and ("TrainJob" in kinds) == (mode == "trainjob")
    assert (("Job", "ps") in by_key(docs)) == (mode == "jobs") and "StatefulSet" not in kinds
    assert kinds.count("ServiceMonitor") == 1
    for doc in docs:
        check(doc, ps, workers)


def test_a_trainjob_field_the_crd_does_not_know_is_refused():
    """The vendored schemas can fail: an unknown field, a wrong type, a replicated Job's broken template."""
    import jsonschema
    docs = by_key(rendered(2, 2, trainjob=True))
    runtime, job = docs[("TrainingRuntime", render.TRAINING_RUNTIME)], docs[("TrainJob", render.TRAINJOB_NAME)]
    check_trainjob(runtime, 2, 2)
    for broken, break_it in ((job, lambda d: d["spec"]["runtimeRef"].__setitem__("names", "x")),
                             (runtime, lambda d: d["spec"]["template"]["spec"]["successPolicy"].__setitem__(
                                 "operator", "Most")),
                             (runtime, lambda d: d["spec"]["template"]["spec"].__setitem__("replicatedJob", []))):
        broken = copy.deepcopy(broken)
        break_it(broken)
        with pytest.raises(jsonschema.ValidationError):
            check_trainjob(broken)
    broken = copy.deepcopy(runtime)
    broken["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        check_trainjob(broken)


def test_the_yaml_text_holds_the_same_documents(curve_files):
    opts = options(ps=4, workers=8, curve=True)
    text = render.render_stream(opts, curve_files)
    assert list(yaml.safe_load_all(text)) == render.manifests(opts, curve_files)
    for doc in yaml.safe_load_all(text):
        check(doc, 4, 8)
    files = render.render_files(opts, curve_files, out="k8s")
    from_files = [d for name in files for d in yaml.safe_load_all(files[name])]
    assert from_files == render.manifests(opts, curve_files)


@pytest.mark.parametrize("break_it", [
    lambda docs: docs[("Job", "worker")]["spec"].__setitem__("parallelism", "two"),
    lambda docs: docs[("Job", "broker")]["spec"]["template"]["spec"]["containers"][0]
    .__setitem__("livenessprobe", {}),                                               # a typo: strict mode
    lambda docs: docs[("Service", "ps")]["spec"]["ports"][0].__setitem__("port", "5600"),
    lambda docs: docs[("Deployment", "serve0")]["spec"]["template"]["spec"].pop("containers"),
], ids=["replicas-string", "unknown-field", "port-string", "no-containers"])
def test_a_broken_document_is_refused(break_it):
    """The check can fail: a deliberately broken copy of a valid manifest is refused."""
    docs = by_key(copy.deepcopy(rendered(2, 4)))
    before = {key: copy.deepcopy(doc) for key, doc in docs.items()}
    break_it(docs)
    [broken] = [doc for key, doc in docs.items() if doc != before[key]]
    validate(before[(broken["kind"], broken["metadata"]["name"])])
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


def test_a_broken_tfjob_pod_template_is_refused():
    [job] = [d for d in rendered(2, 2, tfjob=True) if d["kind"] == "TFJob"]
    template = copy.deepcopy(job["spec"]["tfReplicaSpecs"]["Worker"]["template"])
    template["spec"]["containers"][0]["resources"]["requests"]["memory"] = ["1Gi"]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(as_pod_template("worker", template))


# ------------------------------------------------------------------ the topology


@pytest.mark.parametrize("ps,workers", SIZES)
def test_names_and_ports_agree_with_the_cluster_spec(ps, workers):
    docs = by_key(rendered(ps, workers))
    cluster = ClusterSpec(json.loads(docs[("ConfigMap", "zmqflow-cluster")]["data"]["cluster.json"]))
    cluster.validate(require_dense=True)
    assert cluster.num_tasks("ps") == ps and cluster.num_tasks("chief") + cluster.num_tasks("worker") == workers
    assert cluster.job_tasks("broker") == ["broker:5555"] and ("Service", "broker") in docs
    for job, base in (("ps", 5600), ("chief", 5610), ("worker", 5611)):
        service, indexed = docs[("Service", job)], docs[("Job", job)]
        pod = indexed["spec"]["template"]
        assert service["spec"]["clusterIP"] == "None" and pod["spec"]["subdomain"] == job
        assert indexed["spec"]["completionMode"] == "Indexed"
        assert indexed["spec"]["completions"] == indexed["spec"]["parallelism"] == cluster.num_tasks(job)
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [
            (f"{job}-{i}", base + i) for i in range(cluster.num_tasks(job))] + [
            ("metrics", int(pod["metadata"]["annotations"]["prometheus.io/port"]))]
        for i, address in enumerate(cluster.job_tasks(job)):
            assert address == f"{job}-{i}.{job}:{base + i}"   # an Indexed Job's pod i: hostname <job>-i


@pytest.mark.parametrize("ps,workers", SIZES)
def test_the_tfjob_has_the_counts_and_no_statefulsets(ps, workers):
    docs = by_key(rendered(ps, workers, tfjob=True))
    assert not [key for key in docs if key[0] == "StatefulSet" or key in (("Service", "ps"), ("Job", "ps"))]
    check_tfjob(docs[("TFJob", "zmqflow-train")], ps, workers)


@pytest.mark.parametrize("ps,workers", SIZES)
def test_the_trainjob_runs_the_same_tasks_under_the_names_its_jobset_gives(ps, workers, tmp_path):
    """Trainer v2: the runtime's replicated Jobs hold the same commands as the Jobs of ps.yaml and worker.yaml;
    TF_CONFIG from trainjob-cluster.json names the pods as the JobSet does (<trainjob>-<job>-0-<index>.<trainjob>)."""
    docs = by_key(rendered(ps, workers, trainjob=True))
    plain = by_key(rendered(ps, workers))
    assert not [key for key in docs if key in (("Job", "ps"), ("Job", "chief"), ("TFJob", "zmqflow-train"))]
    runtime = docs[("TrainingRuntime", render.TRAINING_RUNTIME)]
    check_trainjob(runtime, ps, workers)
    check_trainjob(docs[("TrainJob", render.TRAINJOB_NAME)])
    assert runtime["spec"]["template"]["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    data = docs[("ConfigMap", "zmqflow-cluster")]["data"]
    cluster = ClusterSpec(json.loads(data[render.TRAINJOB_CLUSTER]))
    same = ClusterSpec(json.loads(data["cluster.json"]))
    for job in ("ps", "chief", "worker"):
        if not same.num_tasks(job):
            continue
        [replicated] = [j for j in runtime["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == job]
        main = replicated["template"]["spec"]["template"]["spec"]["containers"][0]
        assert main["args"] == plain[("Job", job)]["spec"]["template"]["spec"]["containers"][0]["args"], job
        env = {e["name"]: e.get("value") for e in main["env"]}
        assert env["TASK_TYPE"] == job and env["CLUSTER_JSON"] == f"/etc/zmqflow/{render.TRAINJOB_CLUSTER}"
        for i, (address, port) in enumerate(zip(cluster.job_tasks(job), same.job_tasks(job))):
            assert address == f"zmqflow-train-{job}-0-{i}.zmqflow-train:{port.rsplit(':', 1)[1]}"
    (tmp_path / render.TRAINJOB_CLUSTER).write_text(data[render.TRAINJOB_CLUSTER])
    out = subprocess.run(["sh", "-c", data["entrypoint.sh"], "entrypoint", sys.executable, "-c",
                          "import os; print(os.environ['TF_CONFIG'])"], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "TASK_TYPE": "ps", "JOB_COMPLETION_INDEX": str(ps - 1),
                              "CLUSTER_JSON": str(tmp_path / render.TRAINJOB_CLUSTER)})
    task = ClusterSpec.from_tf_config({"TF_CONFIG": out.stdout})
    assert task.address == f"zmqflow-train-ps-0-{ps - 1}.zmqflow-train:{5600 + ps - 1}", out.stderr


def test_the_entry_snippet_and_the_probes_find_each_pods_port(tmp_path):
    """TF_CONFIG from the pod name for the last of 4 ps / 8 workers (the chief and 7 others); the ps probe pings
    its own port."""
    docs = by_key(rendered(4, 8))
    data = docs[("ConfigMap", "zmqflow-cluster")]["data"]
    (tmp_path / "cluster.json").write_text(data["cluster.json"])
    (tmp_path / "entrypoint.sh").write_text(data["entrypoint.sh"].replace("/etc/zmqflow", str(tmp_path)))
    fake = tmp_path / "bin" / "zmqflow"   # prints what it was asked, and TF_CONFIG
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "$@"\necho "${TF_CONFIG:-}"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    for pod, job, index, port in (("ps-3", "ps", 3, 5603), ("chief-0", "chief", 0, 5610), ("worker-6", "worker", 6, 5617)):
        main = docs[("Job", job)]["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "TASK_TYPE", "value": job} in main["env"]
        argv = [a.replace("/etc/zmqflow", str(tmp_path)) for a in main["command"] + main["args"]]
        out = subprocess.run(argv, env={**env, "TASK_TYPE": job, "JOB_COMPLETION_INDEX": str(index)},
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        said, tf_config = out.stdout.splitlines()
        assert said == " ".join(main["args"])
        task = ClusterSpec.from_tf_config({"TF_CONFIG": tf_config})
        assert (task.task_type, task.task_index, task.address) == (job, index, f"{pod}.{job}:{port}")
    ps = docs[("Job", "ps")]["spec"]["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        out = subprocess.run(ps[probe]["exec"]["command"], env={**env, "JOB_COMPLETION_INDEX": "3"},
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.splitlines()[0].startswith("ping --address tcp://127.0.0.1:5603"), probe


@pytest.mark.parametrize("members", [1, 3, 5])
def test_the_aggregator_lists_every_model_server(members):
    docs = by_key(rendered(2, 2, serve=members))
    args = docs[("Deployment", "aggregator")]["spec"]["template"]["spec"]["containers"][0]["args"]
    listed = [args[i + 1] for i, a in enumerate(args) if a == "--member"]
    assert listed == [f"tcp://serve{i}:{5700 + i}" for i in range(members)]
    servers = sorted(name for kind, name in docs if kind == "Deployment" and name.startswith("serve"))
    assert servers == sorted(f"serve{i}" for i in range(members))
    for i in range(members):
        serve = docs[("Deployment", f"serve{i}")]["spec"]["template"]["spec"]["containers"][0]
        assert f"0.0.0.0:{5700 + i}" in serve["args"]
        assert [p["port"] for p in docs[("Service", f"serve{i}")]["spec"]["ports"]] == [5700 + i, 6700 + i]


@pytest.mark.parametrize("tfjob", [False, True], ids=["statefulsets", "tfjob"])
@pytest.mark.parametrize("ps,workers", SIZES)
def test_every_container_has_probes_resources_and_runs_as_the_image_user(ps, workers, tfjob):
    for name, template in pod_templates(rendered(ps, workers, tfjob=tfjob)):
        spec = template["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == UID
        for c in spec["containers"]:
            assert "readinessProbe" in c and "livenessProbe" in c, (name, c["name"])
        for c in spec.get("initContainers", []) + spec["containers"]:
            resources = c["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), (name, c["name"])
            assert "memory" in resources["limits"], (name, c["name"])
            assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["runAsUser"] == UID
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert {"name": "metrics", "containerPort": int(annotations["prometheus.io/port"])} in spec["containers"][0][
            "ports"], name


@pytest.mark.parametrize("ps,workers", SIZES)
def test_probes_ping_the_servers_and_spare_a_busy_worker(ps, workers):
    docs = by_key(rendered(ps, workers))
    for name, port in [("broker", 5555), ("aggregator", 5800), ("serve0", 5700), ("serve1", 5701)]:
        main = docs[("Job" if name == "broker" else "Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
        assert main["readinessProbe"]["exec"]["command"] == ["zmqflow", "ping", "--address", f"tcp://127.0.0.1:{port}"]
        assert main["livenessProbe"]["exec"]["command"][:4] == ["zmqflow", "ping", "--address", f"tcp://127.0.0.1:{port}"]
    worker = docs[("Job", "worker")]["spec"]["template"]["spec"]["containers"][0]
    assert worker["readinessProbe"]["exec"]["command"][-2:] == ["cluster", "check"]
    live = worker["livenessProbe"]
    assert "exec" not in live   # not the cluster check: a worker is not killed for its peers, nor for a long step
    assert live["periodSeconds"] * live["failureThreshold"] >= 120
    assert "startupProbe" in worker   # liveness counts once the task runs
    gateway = docs[("Deployment", "gateway")]["spec"]["template"]["spec"]["containers"][0]
    assert gateway["args"][:3] == ["gateway", "--aggregator", "tcp://aggregator:5800"]   # the aggregator's Service
    assert gateway["readinessProbe"]["grpc"] == {"port": 8001}   # grpc.health.v1's Check: ready as /v2/health/ready
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"


def test_every_service_command_parses_with_the_real_cli():
    """`zmqflow` + args is a registered command with valid options (the image's entrypoint is zmqflow)."""
    from zmqflow.cli.main import main
    docs = rendered(2, 3, serve=2) + rendered(2, 3, tfjob=True) + rendered(
        1, 1, data="/app/pets.yaml", model="cnn", model_options=("filters=[8, 16]",), name="pets")
    saved_requested, saved_env = dict(metrics._requested), os.environ.get(METRICS_BIND_ENV)
    try:
        for name, template in pod_templates(docs):
            spec = template["spec"]
            for c in spec.get("initContainers", []) + spec["containers"]:
                assert c["command"][-1] == "zmqflow", (name, c["name"])
                command, args = main, list(c["args"])
                while isinstance(command, click.Group):
                    command = command.get_command(click.Context(command), args.pop(0))
                    assert command is not None, (name, c["args"])
                with command.make_context(command.name, args):
                    pass
    finally:
        metrics._requested.clear()
        metrics._requested.update(saved_requested)
        if saved_env is not None:
            os.environ[METRICS_BIND_ENV] = saved_env


# ------------------------------------------------------------------ CURVE


def test_the_secret_appears_only_with_curve(curve_files):
    assert not [d for d in rendered(2, 4) if d["kind"] == "Secret"]
    for name, template in pod_templates(rendered(2, 4)):
        assert "curve" not in json.dumps(template), name
    secrets = [d for d in rendered(2, 4, curve_files) if d["kind"] == "Secret"]
    assert [(s["metadata"]["name"], s["type"]) for s in secrets] == [("zmqflow-curve", "Opaque")]


@pytest.mark.parametrize("tfjob", [False, True], ids=["statefulsets", "tfjob"])
def test_the_secret_is_mounted_read_only_in_every_pod(curve_files, tfjob):
    docs = rendered(4, 8, curve_files, tfjob=tfjob)
    templates = list(pod_templates(docs))
    assert len(templates) == 10   # broker, reader, 3 model servers, aggregator, gateway; ps, chief and workers
    for name, template in templates:
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        [secret_volume] = [n for n, v in volumes.items() if v.get("secret", {}).get("secretName") == "zmqflow-curve"]
        assert volumes[secret_volume]["secret"]["defaultMode"] & 0o007 == 0, name   # not world-readable
        for c in spec["containers"]:
            env = {e["name"]: e.get("value") for e in c["env"]}
            [mount] = [m for m in c["volumeMounts"] if m["name"] == secret_volume]
            assert mount["readOnly"] is True and env[curve.ENV] == mount["mountPath"], (name, c["name"])


def test_the_secret_holds_real_keys_from_the_projects_generation(curve_files, tmp_path):
    [secret] = [d for d in rendered(2, 2, curve_files) if d["kind"] == "Secret"]
    [template] = [t for name, t in pod_templates(rendered(2, 2, curve_files)) if name == "broker"]
    [volume] = [v for v in template["spec"]["volumes"] if "secret" in v]
    for item in volume["secret"]["items"]:   # lay the files out as the kubelet does
        path = tmp_path / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(secret["data"][item["key"]], validate=True))
    assert set(secret["data"]) == {path.replace("/", "-") for path in render.curve_file_names()}
    assert "client.key_secret" not in secret["data"]   # the every-role default pair: no pod needs it
    with pytest.MonkeyPatch.context() as env:
        env.setenv(curve.KEY_ENV, "serving")            # the broker's key (its healthcheck pings)
        curve.check_dir(str(tmp_path))
        server, client = curve.ServerKeys(str(tmp_path)), curve.ClientKeys(str(tmp_path))
    assert client.server_public == server.public
    for key in ("member", "serving", "admin"):
        assert base64.b64decode(secret["data"][f"authorized-{key}.key"]) == base64.b64decode(secret["data"][f"{key}.key"])
    assert render.generate_curve_files() != curve_files   # fresh keys every time


def test_curve_is_the_default_and_without_key_files_the_pods_mount_a_secret_applied_on_its_own():
    docs = render.manifests(render.Options())
    assert not [d for d in docs if d["kind"] == "Secret"]              # deploy/k8s: no private keys in the repo
    for name, template in pod_templates(docs):
        assert any(v.get("secret", {}).get("secretName") == "zmqflow-curve" for v in template["spec"]["volumes"]), name
    assert "--no-curve" in render.Options(curve=False).command_line()


# ------------------------------------------------------------------ the command


def invoke(*args):
    return CliRunner().invoke(k8s, ["render", *args])


def test_render_prints_one_multi_document_stream():
    result = invoke("--num-ps", "4", "--num-workers", "8", "--num-serve", "2", "--epochs", "1", "--namespace", "ml",
                    "--image", "registry.example/zmqflow:1.2")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Generated by `zmqflow k8s render --num-ps 4 --num-workers 8 --num-serve 2 --epochs 1")
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    [secret] = [d for d in docs if d["kind"] == "Secret"]                 # CURVE by default: fresh keys
    files = {path: base64.b64decode(secret["data"][path.replace("/", "-")]) for path in render.curve_file_names()}
    assert docs == render.manifests(options(ps=4, workers=8, serve=2, epochs=1, namespace="ml",
                                             image="registry.example/zmqflow:1.2"), files)
    [namespace] = [d for d in docs if d["kind"] == "Namespace"]        # cluster-scoped: the one without a namespace
    assert namespace["metadata"]["name"] == "ml" and docs[0] is namespace   # created before anything is put in it
    assert {d["metadata"].get("namespace") for d in docs if d is not namespace} == {"ml"}
    reader = by_key(docs)[("Job", "reader")]["spec"]["template"]["spec"]["containers"][0]
    assert reader["args"][reader["args"].index("--num-epochs") + 1] == "1"
    assert {c["image"] for _, t in pod_templates(docs) for c in t["spec"]["containers"]} == {
        "registry.example/zmqflow:1.2"}


@pytest.mark.parametrize("args", [["--num-ps", "0"], ["--num-workers", "0"], ["--num-ps", "-1"], ["--num-serve", "0"],
                                  ["--num-workers", "two"], ["--namespace", "Not_A_Label"], ["--data", " "],
                                  ["--model", ""], ["--model-opt", "no-value"], ["--model-name", ""]])
def test_bad_values_are_usage_errors(args):
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert "Error" in result.output


def test_help_documents_every_option():
    result = invoke("--help")
    assert result.exit_code == 0
    for option in ("--num-ps", "--num-workers", "--image", "--curve", "--no-curve", "--curve-dir", "--tfjob",
                   "--num-serve", "--epochs", "--namespace", "--out", "--data", "--model", "--model-opt", "--model-name"):
        assert option in result.output, option


def test_curve_warns_that_the_output_holds_private_keys():
    result = invoke("--num-ps", "2", "--num-workers", "4", "--curve")
    assert result.exit_code == 0, result.output
    assert "private keys" in result.stderr and "note:" not in result.stdout
    assert ("Secret", "zmqflow-curve") in by_key(d for d in yaml.safe_load_all(result.stdout) if d)


def test_out_writes_one_file_per_component(tmp_path):
    out = tmp_path / "k8s"
    result = invoke("--num-ps", "2", "--num-workers", "4", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(out)) == ["aggregator.yaml", "broker.yaml", "cluster.yaml", "curve.yaml", "gateway.yaml",
                                       "monitoring.yaml", "ps.yaml", "reader.yaml", "serve.yaml", "worker.yaml"]
    assert stat.S_IMODE(os.stat(out / "curve.yaml").st_mode) == 0o600   # private keys
    with open(out / "ps.yaml") as f:
        assert f.readline().startswith(f"# Generated by `zmqflow k8s render --num-ps 2 --num-workers 4 --out {out}`")
    tfjob = tmp_path / "tfjob"
    result = invoke("--num-ps", "2", "--num-workers", "4", "--no-curve", "--tfjob", "--out", str(tfjob))
    assert result.exit_code == 0, result.output
    assert sorted(os.listdir(tfjob)) == ["aggregator.yaml", "broker.yaml", "cluster.yaml", "gateway.yaml",
                                         "monitoring.yaml", "reader.yaml", "serve.yaml", "tfjob.yaml"]


def test_curve_dir_puts_the_given_keys_in_the_secret(tmp_path):
    keys = str(tmp_path / "keys")
    curve.generate(keys)                                                  # the default client pair only
    result = invoke("--curve-dir", keys)
    assert result.exit_code == 2, result.output
    assert (f"CURVE key file {keys}/member.key: No such file or directory (a deployment needs one key per role: "
            f"`zmqflow keys generate {keys} --clients member,serving,admin --keep` adds them)") in result.output
    curve.generate(keys, ["member", "serving", "admin"], keep=True)
    result = invoke("--curve-dir", keys)
    assert result.exit_code == 0, result.output
    [secret] = [d for d in yaml.safe_load_all(result.stdout) if d and d["kind"] == "Secret"]
    assert base64.b64decode(secret["data"]["admin.key_secret"]) == (tmp_path / "keys" / "admin.key_secret").read_bytes()
    result = invoke("--curve-dir", str(tmp_path))                         # no keys there
    assert result.exit_code == 2 and "server.key_secret is missing" in result.output, result.output
    assert invoke("--no-curve", "--curve-dir", keys).exit_code == 2


# ------------------------------------------------------------------ data and model


def prepared_pods(docs):
    """(name, pod spec) of every pod with the data initContainer."""
    return [(name, t["spec"]) for name, t in pod_templates(docs) if t["spec"].get("initContainers")]


@pytest.mark.parametrize("tfjob", [False, True], ids=["statefulsets", "tfjob"])
def test_data_and_model_options_reach_every_pod_that_prepares(tfjob):
    args = ["--num-ps", "2", "--num-workers", "3", "--image", "my-zmqflow:1", "--data", "/app/pets.yaml", "--model", "cnn",
            "--model-opt", "filters=[8, 16]", "--model-opt", "dropout=0.25", "--model-name", "pets"]
    result = invoke(*args, *(["--tfjob"] * tfjob))
    assert result.exit_code == 0, result.output
    said = args[:-6] + ["--model-opt", "'filters=[8, 16]'"] + args[-4:] + ["--tfjob"] * tfjob   # shell-quoted
    assert result.stdout.startswith("# Generated by `zmqflow k8s render " + " ".join(said) + "`")
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    pods = prepared_pods(docs)
    expected = ((["zmqflow-train/PS", "zmqflow-train/Chief", "zmqflow-train/Worker", "reader"] if tfjob
                 else ["ps", "chief", "worker", "reader"])
                + ["serve0", "serve1", "serve2"])   # model servers build the job's model.json, not a checkpoint's code
    assert [name for name, _ in pods] == expected
    for name, spec in pods:
        [init] = spec["initContainers"]
        assert init["image"] == "my-zmqflow:1" and init["resources"] == render._resources("data"), name
        assert init["args"] == ["data", "prepare", "--data", "/app/pets.yaml", "--model", "cnn", "--model-opt",
                                "filters=[8, 16]", "--model-opt", "dropout=0.25", "--out", "/prepared"], name
        main = spec["containers"][0]
        wanted = {"ps": ["--model"], "worker": ["--model", "--data-config"], "chief": ["--model", "--data-config"],
                  "reader": ["--data-config"], "serve": ["--model"]}
        role = name.split("/")[-1].lower().rstrip("0123456789")
        for flag in wanted[role]:
            value = main["args"][main["args"].index(flag) + 1]
            assert value == {"--model": "/prepared/model.json", "--data-config": "/prepared/data-config.json"}[flag]
        assert "--examples-per-epoch" not in main["args"] and "--preset" not in main["args"]   # from the config
    for name, template in pod_templates(docs):
        if name.startswith("serve"):
            serve = template["spec"]["containers"][0]["args"]
            assert serve[serve.index("--model-name") + 1] == "pets"


def test_the_init_container_writes_what_the_containers_read_and_every_pod_the_same(tmp_path):
    """The data initContainer's command run for real, as two pods would (one path, one after the other):
    the same bytes, and every path a main container names is there and readable."""
    from zmqflow.services.reader.cli import resolve_data_spec
    docs = rendered(2, 2, model_options=("activation=relu",))
    pods = prepared_pods(docs)
    [init] = {json.dumps(spec["initContainers"][0]["args"]) for _, spec in pods}   # one command in every pod
    prepared = tmp_path / "prepared"
    argv = [a.replace("/prepared", str(prepared)) for a in json.loads(init)]
    pods_files = []
    for pod in range(2):
        done = subprocess.run([sys.executable, "-m", "zmqflow", *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        pods_files.append({p.name: p.read_bytes() for p in sorted(prepared.iterdir())})
        os.rename(prepared, tmp_path / f"pod{pod}")
    assert pods_files[0] == pods_files[1] and len(pods_files[0]) == 10   # data-config, model, 8 shards
    os.rename(tmp_path / "pod0", prepared)
    for name, spec in pods:
        main = spec["containers"][0]["args"]
        for flag in ("--model", "--data-config"):
            if flag in main:
                path = main[main.index(flag) + 1].replace("/prepared", str(prepared))
                with open(path) as f:
                    json.load(f)
                if flag == "--data-config":
                    kind, options, [files], features = resolve_data_spec(path)
                    assert kind == "fixed_length" and features == ["input", "label"]
                    assert len(glob.glob(files)) == 8
    model = json.loads((prepared / "model.json").read_text())
    assert model["activation"] == "relu" and model["layers"][0] == 784   # the option, and fitted to MNIST


@pytest.mark.parametrize("mode", MODES)
def test_training_runs_to_completion_and_stays_done_while_serving_restarts(mode):
    """The broker and the reader of a finished job exit 0 and stay done (Jobs: a Deployment or StatefulSet started
    them again, in a loop); so do the ps shards and workers, whichever way they run; a training pod that fails
    restarts in place, bounded. The serving tasks are Deployments: they restart whenever they stop."""
    docs = rendered(2, 3, **MODES[mode])
    kinds = {d["metadata"]["name"]: d["kind"] for d in docs if d["kind"] not in ("Service", "NetworkPolicy",
                                                                               "ConfigMap", "Namespace",
                                                                               "PersistentVolumeClaim", "ServiceMonitor")}
    training = {"jobs": {"ps": "Job", "chief": "Job", "worker": "Job"}, "tfjob": {"zmqflow-train": "TFJob"},
                "trainjob": {"zmqflow-train": "TrainJob", render.TRAINING_RUNTIME: "TrainingRuntime"}}[mode]
    assert kinds == {"broker": "Job", "reader": "Job", **training, "serve0": "Deployment", "serve1": "Deployment",
                     "serve2": "Deployment", "aggregator": "Deployment", "gateway": "Deployment"}
    for name, template in pod_templates(docs):
        if mode == "tfjob" and name.startswith("zmqflow-train/"):
            continue          # the operator's replica restartPolicy: OnFailure (check_tfjob)
        policy = template["spec"].get("restartPolicy", "Always")
        serving = name in ("serve0", "serve1", "serve2", "aggregator", "gateway")
        assert policy == ("Always" if serving else "OnFailure"), name
    for doc in docs:
        if doc["kind"] == "Job":
            assert doc["spec"]["backoffLimit"] == render.BACKOFF_LIMIT and "ttlSecondsAfterFinished" not in doc["spec"]


@pytest.mark.parametrize("mode", MODES)
def test_a_service_monitor_scrapes_every_tasks_metrics_port(mode):
    """Every pod's metrics port is behind a Service the ServiceMonitor selects (app: zmqflow, port `metrics`)."""
    docs = rendered(2, 3, **MODES[mode])
    [monitor] = [d for d in docs if d["kind"] == "ServiceMonitor"]
    check_service_monitor(monitor)
    selector = monitor["spec"]["selector"]["matchLabels"]
    services = [d for d in docs if d["kind"] == "Service" and selector.items() <= d["metadata"]["labels"].items()
                and any(p["name"] == "metrics" for p in d["spec"]["ports"])]
    for name, template in pod_templates(docs):
        labels, main = template["metadata"]["labels"], template["spec"]["containers"][0]
        metrics = {"name": "metrics", "containerPort": int(template["metadata"]["annotations"]["prometheus.io/port"])}
        assert metrics in main["ports"], name
        [service] = [s for s in services if s["spec"]["selector"].items() <= labels.items()]
        [port] = [p for p in service["spec"]["ports"] if p["name"] == "metrics"]
        assert port.get("targetPort", port["port"]) in ("metrics", metrics["containerPort"]), name
