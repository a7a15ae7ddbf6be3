"""The Kubernetes manifests of the shipped topology (docker-compose.yml's) for N ps shards and M workers.

`render(options)` returns the components (cluster, curve, broker, ps, worker or tfjob or trainjob, reader, serve,
aggregator, gateway, monitoring), each a list of (comment, manifest dict); `render_files` and `render_stream` turn them
into YAML text (one file per component, or one multi-document stream). Nothing here touches the
disk except `generate_curve_files`, which runs the project's own key generation in a temporary
directory and returns the files' bytes, and `read_curve_files`, which reads a key directory.

CURVE is on by default (every pod mounts the Secret zmqflow-curve and sets ZMQFLOW_CURVE_DIR), so only
the deployment's clients connect; rendered without key files (deploy/k8s in the repository), the Secret
is left out and applied on its own. The Secret holds one client key per role (jobs/spec.py's CURVE_KEYS)
and each pod mounts only its own (`curve_key`: the chief `admin`, the other workers and the reader
`member`, the rest `serving`), with the servers' public key; a server also the server pair and the
authorized public keys. So the chief is a Job of its own (TF_CONFIG's `chief` job, TensorFlow's
and the TFJob's), the other workers another: a Job's pods share one pod spec, one key.

What restarts and what ends: the training tasks (broker, ps shards, chief, workers, reader) run to completion
and stay done, as Jobs (batch/v1; ps and workers Indexed Jobs, whose pods keep the stable names ps-0.ps, ...
under a headless Service), or the Kubeflow TFJob (--tfjob) or Trainer v2's TrainJob (--trainjob); a pod that
fails restarts in place (restartPolicy OnFailure, bounded by backoffLimit) and restores the latest checkpoint.
The serving tasks (model servers, aggregator, gateway) are Deployments: they restart whenever they stop.
A Prometheus Operator ServiceMonitor (monitoring.yaml) scrapes every Service's `metrics` port.

What every pod gets: the same commands as docker-compose.yml (modulo host names and the prepared
directory), a readiness and a liveness probe, resource requests and limits (cpu, memory), Prometheus
annotations and a `metrics` port (its ZeroMQ port + 1000), and the hardening of docs/security.md:
a namespace of its own (Pod Security Standard `restricted` enforced), a non-root user (uid 10001, the
image's) with no capability, the runtime's default seccomp profile, no service-account token, a
read-only root filesystem (emptyDirs of bounded size at /tmp and the home directory are what it may
write), and a NetworkPolicy that lets in only the job's own flows (`INGRESS`) and Prometheus.

Commands: the image's ENTRYPOINT is ["zmqflow"] (CMD ["--help"]), but no container here relies on
it. Every container sets `command:` -- the program: ["zmqflow"], or, where TF_CONFIG comes from the
pod name, the entry snippet followed by "zmqflow" -- and `args:` is always the zmqflow subcommand
with its options: the service's docker-compose command without a leading "zmqflow".

Data and model: every pod that needs them (ps, workers, reader, model servers) runs compose's one-shot `data` command,
`zmqflow data prepare --data SPEC --model MODEL`, as an initContainer into an emptyDir of its own at
/prepared (compose writes /data/prepared once). The command is deterministic, so every pod holds the
same model.json, data-config.json and shards with no ordering between pods, and a pod that restarts
never rewrites files another pod is reading.
"""

import base64
import dataclasses
import json
import os
import re
import shlex
import tempfile
from dataclasses import dataclass
from typing import NamedTuple

import yaml

from zmqflow.common.rpc import encryption as curve
from zmqflow.common.processes.service_cli import to_flags
from zmqflow.common.cluster.spec import ClusterSpec
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.version import __version__
from zmqflow.jobs.spec import (BROKER_PORT, CURVE_KEYS, DEPLOYMENT, GATEWAY_GRPC_PORT, GATEWAY_PORT, PS_PORT,
                               SERVE_PORT, WORKER_PORT, JobSpec, deployment, tasks)

DEFAULT_IMAGE = f"zmqflow:{__version__}"   # the build's version: a fixed tag names what runs (and rolls back)
DEFAULT_NAMESPACE = "zmqflow"
UID = 10001                    # the image's `zmqflow` user
APP = "zmqflow"
CLUSTER_CONFIG_MAP = "zmqflow-cluster"
DATA_CLAIM = "zmqflow-data"
CURVE_SECRET = "zmqflow-curve"
TFJOB_NAME = "zmqflow-train"
TRAINJOB_NAME = "zmqflow-train"             # the TrainJob, and its JobSet (Trainer v2 names it after the TrainJob)
TRAINING_RUNTIME = "zmqflow-ps-training"    # the TrainingRuntime it references
BACKOFF_LIMIT = 6                           # pod restarts (exit non-zero) a training Job allows before it fails
TRAINJOB_CLUSTER = "trainjob-cluster.json"  # the TrainJob pods' cluster spec, in the ConfigMap beside cluster.json
CONFIG_DIR = "/etc/zmqflow"
CURVE_DIR = "/etc/zmqflow-curve"   # ZMQFLOW_CURVE_DIR in every container with --curve
DATA_DIR = "/data"
HOME = "/home/zmqflow"        # the image's user's home: the runtime directory of admin tokens (--no-curve)
PREPARED = "/prepared"        # each pod's own emptyDir: `zmqflow data prepare --out` of its initContainer

ZMQFLOW = ["zmqflow"]
ENTRY = ["sh", f"{CONFIG_DIR}/entrypoint.sh"]

# (cpu request, cpu limit, memory request, memory limit) per container. The cpu limit bounds a runaway (or a
# peer's costly requests) to a few cores, well above the request so that a training step is not throttled.
RESOURCES = {
    "broker": ("250m", "2", "256Mi", "1Gi"),      # holds the queue: 20,000 MNIST rows are ~63 MB
    "ps": ("500m", "4", "512Mi", "2Gi"),
    "worker": ("1", "4", "1Gi", "2Gi"),
    "data": ("100m", "2", "256Mi", "512Mi"),     # `data prepare` of MNIST peaks at ~125 MB
    "reader": ("250m", "2", "256Mi", "1Gi"),
    "serve": ("250m", "2", "256Mi", "1Gi"),
    "aggregator": ("100m", "2", "128Mi", "512Mi"),
    # ~50 MB + --max-inflight-bytes (256 MiB) over REST; up to ~570 MB measured under many 8 MiB gRPC calls
    "gateway": ("100m", "2", "128Mi", "768Mi"),   # (what grpc and the allocator hold beyond it): docs/security.md
}

# Who dials whom (docker-compose.yml's commands): role -> [(ports of its pods, roles whose pods may connect;
# None: anyone)]. Every pod also lets anyone scrape its `metrics` port; the gateway's HTTP and gRPC are the way in.
INGRESS = {
    "broker": [(["zmq"], ["reader", "chief", "worker"])],
    "ps": [(None, ["chief", "worker"])],   # the caller's ports: 5600 + i (a Job's pods share one spec) or tfjob-port
    "chief": [],                               # the chief, workers and readers only dial out
    "worker": [],
    "reader": [],
    "serve": [(["zmq"], ["aggregator", "gateway"])],   # the gateway asks each member for its model_info
    "aggregator": [(["zmq"], ["gateway"])],
    "gateway": [(["http", "grpc"], None)],
}

# Inline checkov skips (checkov.io/skip<n> annotations) of a workload whose image has no digest, with the reason.
UNPINNED_IMAGE_SKIPS = {
    "CKV_K8S_43": "the image is named by tag: a locally built image has no registry digest when the manifests "
                  "are rendered; render with --image NAME@sha256:DIGEST to pin it",
    "CKV_K8S_15": "imagePullPolicy IfNotPresent: a locally built image loaded onto the nodes is in no registry "
                  "that Always could pull from; an image pinned by digest passes without this skip",
}

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z")

ENTRYPOINT_SH = """\
#!/bin/sh
# TF_CONFIG for this pod, then exec the command: TASK_TYPE=ps in an Indexed Job's pod 1 (JOB_COMPLETION_INDEX=1)
# -> {"task": {"type": "ps", "index": 1}}; the cluster from CLUSTER_JSON (default: this folder's cluster.json).
set -eu
TF_CONFIG="{\\"cluster\\": $(cat "${CLUSTER_JSON:-/etc/zmqflow/cluster.json}"), \\"task\\": {\\"type\\": \\"$TASK_TYPE\\", \\"index\\": $JOB_COMPLETION_INDEX}}"
export TF_CONFIG
exec "$@"
"""


@dataclass(frozen=True)
class Options:
    """What `zmqflow k8s render` takes: the job (a JobSpec; the shipped one by default) and what only Kubernetes
    needs (the image, the namespace, CURVE, Jobs or a TFJob or a TrainJob); checked when made (InvalidArgumentError)."""

    spec: JobSpec = DEPLOYMENT
    image: str = DEFAULT_IMAGE
    namespace: str = DEFAULT_NAMESPACE
    curve: bool = True
    tfjob: bool = False
    trainjob: bool = False

    def __post_init__(self):
        if self.tfjob and self.trainjob:
            raise InvalidArgumentError("--tfjob and --trainjob are two ways to run the same training tasks: choose one")
        if not self.image or any(c.isspace() for c in self.image):
            raise InvalidArgumentError(f"image {self.image!r} is not an image reference")
        if not isinstance(self.namespace, str) or not _DNS_LABEL.match(self.namespace):
            raise InvalidArgumentError(f"namespace {self.namespace!r} is not a DNS label "
                                       "(lower case letters, digits and '-', at most 63)")
        deployment(self.spec)   # its ports fit

    def command_line(self, out=None):
        """The `zmqflow k8s render` command that renders these options (the files' header)."""
        spec, base = self.spec, DEPLOYMENT
        changed = {"num-serve": (spec.serving.replicas, base.serving.replicas), "epochs": (spec.training.epochs,
                   base.training.epochs), "image": (self.image, DEFAULT_IMAGE),
                   "namespace": (self.namespace, DEFAULT_NAMESPACE),
                   "data": (spec.data, base.data), "model": (spec.model, base.model)}
        return shlex.join(["zmqflow", "k8s", "render", *to_flags({
            "num-ps": spec.cluster.ps, "num-workers": spec.cluster.workers,
            **{flag: value for flag, (value, default) in changed.items() if value != default},
            "model-opt": spec.model_options, "model-name": None if spec.serving.name == base.serving.name
            else spec.serving.name, "no-curve": not self.curve, "tfjob": self.tfjob, "trainjob": self.trainjob,
            "out": out})])


class Component(NamedTuple):
    """One file's worth: `name`.yaml holds `docs`, a list of (comment or "", manifest dict)."""

    name: str
    docs: list


# ------------------------------------------------------------------ the cluster spec


def _host(role, index):
    return f"{role}-{index}.{role}"      # an Indexed Job's pod's stable name under its headless Service


def cluster_spec(options):
    """The spec every training Job's pod reads: ps-i.ps:5600+i, the chief chief-0.chief:5610, the other workers
    worker-j.worker:5611+j, broker:5555 (the deployment's workers, the first one a job of its own)."""
    cluster = dict(deployment(options.spec, _host).cluster)
    workers = len(cluster.pop("worker"))
    cluster["chief"] = [f"{_host('chief', 0)}:{WORKER_PORT}"]
    if workers > 1:
        cluster["worker"] = [f"{_host('worker', j)}:{WORKER_PORT + 1 + j}" for j in range(workers - 1)]
    return ClusterSpec(cluster).validate(require_dense=True)


def trainjob_cluster_spec(options):
    """The same tasks as the TrainJob's JobSet names its pods: <trainjob>-<replicated job>-0-<index>.<trainjob>
    (Trainer v2's JobSet: one Indexed Job per replicated job, pods under the headless Service named after it)."""
    def host(job, index):
        return f"{TRAINJOB_NAME}-{job}-0-{index}.{TRAINJOB_NAME}"
    return ClusterSpec({job: [f"{host(job, i)}:{address.rsplit(':', 1)[1]}" for i, address in enumerate(addresses)]
                        if job != "broker" else addresses
                        for job, addresses in cluster_spec(options).as_dict().items()}).validate(require_dense=True)


# ------------------------------------------------------------------ the services' command lines
# The job's tasks (jobs/spec.py), as docker-compose.yml runs them; hosts are the Kubernetes Service names,
# and the prepared files are in the pod's own /prepared. A Job's pods share one command: task 0's
# (a deployment's tasks of one role differ only in TF_CONFIG and the metrics port of the environment).


def _tasks(spec):
    """{(role, index): TaskSpec} of the job on Kubernetes."""
    return {(task.role, task.index): task for task in tasks(spec, deployment(spec, _host, prepared=PREPARED))}


def _args(task):
    """The zmqflow subcommand and options of a task (its argv without the leading "zmqflow")."""
    return task.argv()[1:]


# ------------------------------------------------------------------ pieces of pods


def _labels(job, **extra):
    return {"app": APP, "job": job, **extra}


def _metadata(options, name, labels, annotations=None):
    return _present({"name": name, "namespace": options.namespace, "labels": labels, "annotations": annotations})


def _pinned(image):
    return "@sha256:" in image


def _workload_metadata(options, name, labels):
    """A workload's metadata: without an image digest, the checkov checks that need one are skipped inline
    with the reason (UNPINNED_IMAGE_SKIPS)."""
    skips = {} if _pinned(options.image) else {f"checkov.io/skip{i}": f"{check}={reason}"
                                               for i, (check, reason) in enumerate(UNPINNED_IMAGE_SKIPS.items(), 1)}
    return _metadata(options, name, labels, skips)


def _resources(role):
    cpu, cpu_limit, memory, memory_limit = RESOURCES[role]
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu_limit, "memory": memory_limit}}


def _probe(action, period, timeout, failures=3, delay=0):
    """`action` (an exec command or an HTTP GET) every `period` s, failing after `failures` misses in a row."""
    return {**action, **({"initialDelaySeconds": delay} if delay else {}), "periodSeconds": period,
            "timeoutSeconds": timeout, "failureThreshold": failures}


def _exec(command):
    return {"exec": {"command": command}}


def _http_get(path, port):
    return {"httpGet": {"path": path, "port": port}}


def _grpc_check(port):
    """Kubernetes' gRPC probe (1.27+): grpc.health.v1.Health's Check of the server's health on `port` (a number:
    the probe takes no port name)."""
    return {"grpc": {"port": port}}


def _ping(port, timeout=None):
    return ["zmqflow", "ping", "--address", f"tcp://127.0.0.1:{port}", *(["--timeout-secs", str(timeout)] if timeout else [])]


def _ordinal_ping(base, timeout=None):
    """A ping of this Indexed Job pod's own port: base + its index."""
    script = f'zmqflow ping --address "tcp://127.0.0.1:$(({base} + ${{JOB_COMPLETION_INDEX}}))"'
    return ["sh", "-c", script + (f" --timeout-secs {timeout}" if timeout else "")]


def _pinged(ping, port):
    """The probes of a server: ready while it answers a ping, restarted when it stops answering for a minute."""
    return {"readiness": _probe(_exec(ping(port)), 5, 5),
            "liveness": _probe(_exec(ping(port, timeout=5)), 20, 10, delay=30)}


def _dials_out(ready_command):
    """The probes of a task that only dials out (workers, readers): it has no ZeroMQ port to ping, and a
    worker is busy for seconds at a time, so it is alive while its metrics endpoint answers -- on a thread of
    its own, so it answers during a step -- with a long budget (3 minutes of silence). The endpoint starts
    once the task has its peers and input: the startup probe gives it up to 10 minutes before liveness counts."""
    metrics = _http_get("/metrics", "metrics")
    return {"readiness": _probe(_exec(ready_command), 10, 10), "liveness": _probe(metrics, 30, 10, 6),
            "startup": _probe(metrics, 10, 10, 60)}


def _container_security():
    return {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


# What a container may write besides its volumes: /tmp (the health file, NUMBA_CACHE_DIR, temporary files)
# and the home directory (the admin token's runtime directory without CURVE), each an emptyDir of bounded size.
SCRATCH = {"tmp": ("/tmp", "512Mi"), "home": (HOME, "64Mi")}


def _port(name, port):
    return {"name": name, "containerPort": port}


def _present(mapping):
    """`mapping` without its empty entries (a manifest has no `ports: []` nor `startupProbe: null`)."""
    return {key: value for key, value in mapping.items() if value is not None and value != [] and value != {}}


def _container(options, name, role, args, *, command=ZMQFLOW, ports=(), env=(), mounts=(), readiness=None,
               liveness=None, startup=None, init=False):
    """A container of the image, with its scratch directories; with --curve it gets the key directory (mount
    and environment; its key's name comes with the task's environment, `_env`). An init container (`init`)
    gets neither probes nor keys: it never talks ZeroMQ."""
    env = list(env)
    mounts = [*mounts, *({"name": volume, "mountPath": path} for volume, (path, _) in SCRATCH.items())]
    if options.curve and not init:
        env.append({"name": curve.ENV, "value": CURVE_DIR})
        mounts.append({"name": "curve", "mountPath": CURVE_DIR, "readOnly": True})
    elif not init:   # --no-curve: the operator's choice to serve the pod network in the clear (protected mode off)
        env.append({"name": curve.INSECURE_ENV, "value": "1"})
    probes = {} if init else {"startupProbe": startup, "readinessProbe": readiness, "livenessProbe": liveness}
    return _present({"name": name, "image": options.image, "imagePullPolicy": "IfNotPresent",
                     "command": list(command), "args": list(args),
                     "ports": list(ports), "env": env, **probes, "resources": _resources(role),
                     "securityContext": _container_security(), "volumeMounts": mounts})


def _pod_template(options, task, labels, containers, volumes=(), init_containers=()):
    """The pod of `task`: its containers, volumes and, with --curve, the key files of its role (`curve_files_of`:
    a pod that only dials out over ZeroMQ, the gateway and the workers, holds no server secret key)."""
    metrics_port = task.ports["metrics"]
    curve_volume = {"name": "curve", "secret": {"secretName": CURVE_SECRET, "defaultMode": 0o440,
                                                "items": _curve_items(task)}}
    scratch = [{"name": volume, "emptyDir": {"sizeLimit": size}} for volume, (_, size) in SCRATCH.items()]
    spec = {"automountServiceAccountToken": False,   # no pod here talks to the Kubernetes API
            "securityContext": {"runAsNonRoot": True, "runAsUser": UID, "runAsGroup": UID, "fsGroup": UID,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "initContainers": list(init_containers), "containers": list(containers),
            "volumes": [*volumes, *scratch, *([curve_volume] if options.curve else [])]}
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": str(metrics_port)}
    return {"metadata": _present({"labels": labels, "annotations": annotations}), "spec": _present(spec)}


VOLUMES = {"cluster": {"configMap": {"name": CLUSTER_CONFIG_MAP}},
           "data": {"persistentVolumeClaim": {"claimName": DATA_CLAIM}}, "prepared": {"emptyDir": {}}}


def _volumes(*names):
    return [{"name": name, **VOLUMES[name]} for name in names]


def _mount_prepared(read_only=True):
    return {"name": "prepared", "mountPath": PREPARED, **({"readOnly": True} if read_only else {})}


def _data_init(options):
    """The initContainer that writes this pod's /prepared: compose's one-shot `data` command."""
    return _container(options, "data", "data", _args(_tasks(options.spec)["data", 0]),
                      mounts=[_mount_prepared(read_only=False)], init=True)


def _task_type_env(job):
    return {"name": "TASK_TYPE", "value": job}   # the entry snippet's task type (its index: JOB_COMPLETION_INDEX)


def _service(options, name, labels, ports, headless=False):
    # headless: stable per-pod names (ps-1.ps), resolvable before the pod is ready
    spec = {"clusterIP": "None", "publishNotReadyAddresses": True} if headless else {}
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(options, name, labels),
            "spec": {**spec, "selector": labels, "ports": ports}}


def _deployment(options, name, labels, template):
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _workload_metadata(options, name, labels),
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}}


def _job_spec(template, count=1, subdomain=None):
    """A training task's batch/v1 JobSpec: it runs to completion and stays done; a pod that fails restarts in
    place (OnFailure), at most BACKOFF_LIMIT times. `count` > 1 or a `subdomain`: an Indexed Job, pod i named
    <job>-i (<job>-i.<subdomain> under the headless Service of that name)."""
    template["spec"]["restartPolicy"] = "OnFailure"
    if subdomain:
        template["spec"]["subdomain"] = subdomain
    indexed = {"completionMode": "Indexed"} if subdomain or count > 1 else {}
    return {**indexed, "completions": count, "parallelism": count, "backoffLimit": BACKOFF_LIMIT, "template": template}


def _job(options, name, labels, template, count=1, subdomain=None):
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _workload_metadata(options, name, labels),
            "spec": _job_spec(template, count, subdomain)}


def network_policy(options, role, ports=None):
    """(comment, NetworkPolicy) of `role`'s pods: only INGRESS[role]'s flows get in (`ports` for a flow that
    names none: the ps shards' numbers), and anyone may scrape the `metrics` port."""
    def rule(flow_ports, sources):
        return _present({"from": [{"podSelector": {"matchLabels": _labels(source)}} for source in sources or ()],
                         "ports": [{"protocol": "TCP", "port": port} for port in flow_ports or ports]})
    ingress = [rule(flow_ports, sources) for flow_ports, sources in INGRESS[role]] + [rule(["metrics"], None)]
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": _metadata(options, role, _labels(role)),
              "spec": {"podSelector": {"matchLabels": _labels(role)}, "policyTypes": ["Ingress"], "ingress": ingress}}
    flows = [(f"the {' and '.join(sources)} pods" if sources else "anyone",
              ", ".join(str(port) for port in flow_ports or ports)) for flow_ports, sources in INGRESS[role]]
    return ("".join([f"What may connect to the {role} pods (nothing else):\n",
                     *(f"- {who} on port {what}\n" for who, what in flows), "- anyone on port metrics (Prometheus)"]),
            policy)


# ------------------------------------------------------------------ the CURVE secret

# key file (relative to the key directory) -> Secret key (no "/" allowed there)
def _secret_key(path):
    return path.replace("/", "-")


def curve_file_names():
    """The files of the Secret, relative to the key directory (`zmqflow keys generate DIR --clients
    member,serving,admin`): the server pair, and each role's pair and public key in authorized/. Not the
    default `client` pair: it has every role, and no pod needs it."""
    return [f"{curve.SERVER}.key", f"{curve.SERVER}.key_secret",
            *(path for key in CURVE_KEYS for path in (f"{key}.key", f"{key}.key_secret",
                                                       f"{curve.AUTHORIZED}/{key}.key"))]


def curve_files_of(task):
    """The key files `task`'s pod mounts: the servers' public key and its own pair (`curve_key`); a server
    (a task with a ZeroMQ port) also the server's secret key and the public keys of the clients it accepts.
    No pod holds another role's secret key."""
    key = task.env[curve.KEY_ENV]
    paths = [f"{curve.SERVER}.key", f"{key}.key", f"{key}.key_secret"]
    if "zmq" in task.ports:
        paths += [f"{curve.SERVER}.key_secret", *(f"{curve.AUTHORIZED}/{name}.key" for name in CURVE_KEYS)]
    return paths


def _curve_items(task):
    return [{"key": _secret_key(path), "path": path} for path in curve_files_of(task)]


def generate_curve_files():
    """{relative path: bytes} of fresh keys from the project's own generation (common/rpc/encryption.py)."""
    with tempfile.TemporaryDirectory(prefix="zmqflow-curve-") as directory:
        curve.generate(directory, CURVE_KEYS)
        return read_curve_files(directory)


def read_curve_files(directory):
    """{relative path: bytes} of the keys in `directory` (`zmqflow keys generate DIR`), checked first."""
    curve.check_dir(directory)
    files = {}
    for path in curve_file_names():
        try:
            with open(os.path.join(directory, path), "rb") as f:
                files[path] = f.read()
        except OSError as exc:
            raise InvalidArgumentError(
                f"CURVE key file {os.path.join(directory, path)}: {exc.strerror} (a deployment needs one key per "
                f"role: `zmqflow keys generate {directory} --clients {','.join(CURVE_KEYS)} --keep` adds them)"
            ) from None
    return files


def curve_secret(options, files):
    missing = [path for path in curve_file_names() if path not in files]
    if missing:
        raise InvalidArgumentError(f"the CURVE key files {', '.join(missing)} are missing")
    data = {_secret_key(path): base64.b64encode(files[path]).decode("ascii") for path in curve_file_names()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": _metadata(options, CURVE_SECRET, {"app": APP}),
            "type": "Opaque", "data": data}


# ------------------------------------------------------------------ components


def namespace(options):
    """The job's own namespace, where the restricted Pod Security Standard is enforced: a pod that asks for
    more (root, a capability, privilege escalation, no seccomp profile) is refused at admission."""
    labels = {"app": APP, **{f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "warn")}}
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": options.namespace, "labels": labels}}


def cluster_component(options):
    spec = cluster_spec(options)
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(options, CLUSTER_CONFIG_MAP, {"app": APP}),
              "data": {"cluster.json": json.dumps(spec.as_dict()) + "\n",
                       TRAINJOB_CLUSTER: json.dumps(trainjob_cluster_spec(options).as_dict()) + "\n",
                       "entrypoint.sh": ENTRYPOINT_SH}}
    claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
             "metadata": _metadata(options, DATA_CLAIM, {"app": APP}),
             "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}
    return Component("cluster", [
        (f"The job's namespace (--namespace): apply this file first. Its pods meet the restricted Pod Security\n"
         "Standard, which the namespace enforces.", namespace(options)),
        ("The cluster spec every training Job's pod reads (the TrainJob's pods: trainjob-cluster.json), and the entry\n"
         "snippet that turns it into this pod's TF_CONFIG: the task type from TASK_TYPE, the index from the Indexed\n"
         "Job's JOB_COMPLETION_INDEX (pod i of the Indexed Job <job> has the hostname <job>-i).", config),
        ("Checkpoints: the ps shards write them when the chief asks and restore the latest after a restart;\n"
         "the model servers serve them. Pods on several nodes need a ReadWriteMany storage class\n"
         "(NFS, CephFS, EFS, Filestore...).", claim),
    ])


def curve_component(options, files):
    return Component("curve", [
        (f"CURVE keys (`zmqflow keys generate`): mounted read-only at {CURVE_DIR} in every pod, where\n"
         f"{curve.ENV} points the services and their clients (files mode 0440, defaultMode 288, group\n"
         f"{UID}). This Secret holds PRIVATE keys (server.key_secret, client.key_secret): keep it out of\n"
         "version control.", curve_secret(options, files)),
    ])


def _env(options, task):
    """The task's environment but TF_CONFIG (the entry snippet or the TFJob operator sets that), and without
    --curve its key's name."""
    skip = {"TF_CONFIG", *(() if options.curve else (curve.KEY_ENV,))}
    return [{"name": key, "value": value} for key, value in task.env.items() if key not in skip]


def _served(options, task, comment="", mounts=(), volumes=(), probes=None, init_containers=(), job=False):
    """A server task as a Deployment (with `job`: a Job, for the broker, which ends with the training) and a
    Service on the task's ports (a model server's labels name its member; the gateway serves HTTP and gRPC, no
    ZeroMQ: its keys are a client's, `curve_files_of`)."""
    labels = _labels(task.role, **({"member": str(task.index)} if task.role == "serve" else {}))
    main = _container(options, task.role, task.role, _args(task), ports=[_port(n, p) for n, p in task.ports.items()],
                      env=_env(options, task), mounts=mounts, **(probes or _pinged(_ping, task.ports["zmq"])))
    template = _pod_template(options, task, labels, [main], volumes, init_containers)
    ports = [{"name": name, "port": port, "targetPort": port, **({"appProtocol": "grpc"} if name == "grpc" else {})}
             for name, port in task.ports.items()]   # appProtocol: for meshes and Ingresses that route gRPC
    workload = (_job if job else _deployment)(options, task.name, labels, template)
    return [(comment, _service(options, task.name, labels, ports)), ("", workload)]


def _training_template(options, task, job, probes, ports, cluster_file=None, volumes=("cluster", "data", "prepared")):
    """The pod of a training task (ps, chief, worker) whose TF_CONFIG the entry snippet makes from its
    TASK_TYPE (`job`) and Indexed Job index, from the ConfigMap's cluster.json (or `cluster_file`)."""
    env = [_task_type_env(job)] + ([{"name": "CLUSTER_JSON", "value": f"{CONFIG_DIR}/{cluster_file}"}]
                                   if cluster_file else []) + _env(options, task)
    mounts = [{"name": "cluster", "mountPath": CONFIG_DIR}, {"name": "data", "mountPath": DATA_DIR}, _mount_prepared()]
    main = _container(options, task.role, task.role, _args(task), command=ENTRY + ZMQFLOW, ports=ports, env=env,
                      mounts=mounts, **probes)
    return _pod_template(options, task, _labels(job), [main], _volumes(*volumes), init_containers=[_data_init(options)])


def _indexed(options, task, count, base, comment, probes, job=None):
    """ps, the chief or workers (`job`, default the task's role): an Indexed Job of `count` pods <job>-<i>.<job>
    behind a headless Service (its ports: each task's, and `metrics`), each task's TF_CONFIG made by the entry
    snippet. They run to completion (the chief tells the ps shards to exit) and stay done."""
    job = job or task.role
    labels, metrics = _labels(job), task.ports["metrics"]
    template = _training_template(options, task, job, probes, [_port("metrics", metrics)])
    ports = [{"name": f"{job}-{i}", "port": base + i} for i in range(count)]
    policy = network_policy(options, job, [port["port"] for port in ports])
    service = _service(options, job, labels, ports + [_metrics_port(metrics)], headless=True)
    return [(comment, service), ("", _job(options, job, labels, template, count, subdomain=job)), policy]


def _metrics_port(port):
    return {"name": "metrics", "port": port, "targetPort": "metrics"}


def _metrics_service(options, job, port):
    """A headless Service on the `metrics` port of `job`'s pods, for the ServiceMonitor (--tfjob, --trainjob: the
    operators' own Services name no metrics port)."""
    return ("", _service(options, f"{job}-metrics", _labels(job), [_metrics_port(port)], headless=True))


def ps_component(options):
    count = options.spec.cluster.ps
    return Component("ps", _indexed(options, _tasks(options.spec)["ps", 0], count, PS_PORT, (
        f"ps shards: an Indexed Job of {count} pods with the stable names ps-0.ps, ps-1.ps, ... from the headless\n"
        "Service; they serve until the chief tells them to exit (0), and the Job is then complete, not restarted;\n"
        f"shard i listens on {PS_PORT} + i (the port of its task in cluster.json). Each pod's initContainer\n"
        f"fits the model to the data ({PREPARED}/model.json) as the reader's prepares its shards: the same bytes\n"
        "in every pod."), _pinged(_ordinal_ping, PS_PORT)))


def worker_component(options):
    count, job_tasks = options.spec.cluster.workers, _tasks(options.spec)
    probes = _dials_out(ENTRY + ["zmqflow", "cluster", "check"])
    chief = _indexed(options, job_tasks["worker", 0], 1, WORKER_PORT, (
        f"The chief, chief-0.chief (TF_CONFIG's chief job: worker 0 of the job's {count}), and the other workers,\n"
        "worker-0.worker, ...: two Indexed Jobs, so only the chief's pod holds the admin key (it initializes or\n"
        "restores the ps shards and shuts them and the broker down; the workers hold the member key). They dial\n"
        "out only; the headless Services give them the stable names of the cluster spec. A worker is ready while\n"
        "every server of its cluster answers (`zmqflow cluster check`), alive while its metrics endpoint answers\n"
        "(its own thread: a long step does not count). The initContainer writes the model and the data config\n"
        f"({PREPARED}): the chief scores the data's test split at the end."), probes, job="chief")
    workers = _indexed(options, job_tasks["worker", 1], count - 1, WORKER_PORT + 1, "", probes) if count > 1 else []
    return Component("worker", chief + workers)


def tfjob_component(options):
    def replica(task, count, port, probes, job=None):
        main = _container(options, "tensorflow", task.role, _args(task),   # the container the operator gives TF_CONFIG
                          ports=[_port("tfjob-port", port), _port("metrics", task.ports["metrics"])],
                          env=_env(options, task), mounts=[{"name": "data", "mountPath": DATA_DIR}, _mount_prepared()],
                          **probes)
        template = _pod_template(options, task, _labels(job or task.role), [main], _volumes("data", "prepared"),
                                 init_containers=[_data_init(options)])
        return {"replicas": count, "restartPolicy": "OnFailure", "template": template}

    spec, job_tasks = options.spec, _tasks(options.spec)
    probes = _dials_out(["zmqflow", "cluster", "check"])
    replicas = {"PS": replica(job_tasks["ps", 0], spec.cluster.ps, PS_PORT, _pinged(_ping, PS_PORT)),
                "Chief": replica(job_tasks["worker", 0], 1, WORKER_PORT, probes, job="chief")}
    if spec.cluster.workers > 1:   # the chief is worker 0 of the job: its own replica type, the admin key
        replicas["Worker"] = replica(job_tasks["worker", 1], spec.cluster.workers - 1, WORKER_PORT, probes)
    job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
           "metadata": _workload_metadata(options, TFJOB_NAME, {"app": APP}),
           "spec": {"runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 3},
                    "tfReplicaSpecs": replicas}}
    curve_file = " -f curve.yaml" if options.curve else ""
    return Component("tfjob", [
        (f"The same training job under Kubeflow's training operator, instead of ps.yaml and worker.yaml: the\n"
         f"operator creates the {spec.cluster.ps} ps pods, the chief and {spec.cluster.workers - 1} worker pods and "
         "sets TF_CONFIG in each "
         f"(services {TFJOB_NAME}-ps-0, ...\n"
         "on the port named tfjob-port), so the commands are those of docker-compose.yml with no entry snippet;\n"
         f"each pod's initContainer prepares the model and the data in {PREPARED}, as in the Jobs of ps.yaml.\n"
         "The broker, the reader and the model servers come from the other files:\n"
         f"  kubectl apply -f cluster.yaml{curve_file} -f broker.yaml -f reader.yaml -f tfjob.yaml "
         "-f serve.yaml -f aggregator.yaml -f gateway.yaml\n"
         "The job succeeds when the chief exits 0; it has told the ps shards and the broker to exit\n"
         "by then. Exit code 3 (a peer lost) restarts the pod (OnFailure): it restores the latest checkpoint.", job),
        network_policy(options, "ps", ["tfjob-port"]), network_policy(options, "chief"),
        network_policy(options, "worker"), *_training_metrics_services(options),
    ])


def _training_metrics_services(options):
    job_tasks = _tasks(options.spec)
    jobs = [("ps", job_tasks["ps", 0]), ("chief", job_tasks["worker", 0])]
    if options.spec.cluster.workers > 1:
        jobs.append(("worker", job_tasks["worker", 1]))
    return [_metrics_service(options, job, task.ports["metrics"]) for job, task in jobs]


def trainjob_component(options):
    """Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1): a TrainingRuntime holding the job's JobSet template
    (an Indexed Job each for the ps shards, the chief and the other workers) and the TrainJob that runs it."""
    spec, job_tasks = options.spec, _tasks(options.spec)
    probes = _dials_out(ENTRY + ["zmqflow", "cluster", "check"])

    def replicated(name, task, count, probes, ancestor=False):
        template = _training_template(options, task, name, probes, [_port("metrics", task.ports["metrics"])],
                                      cluster_file=TRAINJOB_CLUSTER)
        job_template = {"spec": _job_spec(template, count)}
        job_template["spec"]["completionMode"] = "Indexed"   # JOB_COMPLETION_INDEX: the task index
        if ancestor:   # the job Trainer's `trainer:` overrides of a TrainJob (env, numNodes) would apply to
            job_template["metadata"] = {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}
        return {"name": name, "replicas": 1, "template": job_template}

    jobs = [replicated("ps", job_tasks["ps", 0], spec.cluster.ps, _pinged(_ordinal_ping, PS_PORT)),
            replicated("chief", job_tasks["worker", 0], 1, probes, ancestor=True)]
    if spec.cluster.workers > 1:
        jobs.append(replicated("worker", job_tasks["worker", 1], spec.cluster.workers - 1, probes))
    runtime = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
               "metadata": _workload_metadata(options, TRAINING_RUNTIME, {"app": APP}),
               "spec": {"template": {"spec": {
                   "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                   "successPolicy": {"operator": "All", "targetReplicatedJobs": ["chief"]},
                   "failurePolicy": {"maxRestarts": 3},
                   "replicatedJobs": jobs}}}}
    train_job = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                 "metadata": _metadata(options, TRAINJOB_NAME, {"app": APP}),
                 "spec": {"runtimeRef": {"name": TRAINING_RUNTIME, "apiGroup": "trainer.kubeflow.org",
                                         "kind": "TrainingRuntime"}}}
    curve_file = " -f curve.yaml" if options.curve else ""
    return Component("trainjob", [
        (f"The same training job under Kubeflow Trainer v2 (the Training Operator's successor), instead of ps.yaml and\n"
         "worker.yaml: the TrainingRuntime holds the job's JobSet template, an Indexed Job each for the "
         f"{spec.cluster.ps} ps shards,\nthe chief and the {spec.cluster.workers - 1} other workers; the TrainJob runs "
         f"it as the JobSet {TRAINJOB_NAME}, whose pods are named\n{TRAINJOB_NAME}-<job>-0-<index>.{TRAINJOB_NAME} "
         f"(the ConfigMap's {TRAINJOB_CLUSTER}; the entry snippet makes TF_CONFIG from it).\n"
         "Trainer v2 has no TensorFlow policy: the runtime has no mlPolicy, the commands are docker-compose.yml's.\n"
         "The broker, the reader and the model servers come from the other files:\n"
         f"  kubectl apply -f cluster.yaml{curve_file} -f broker.yaml -f reader.yaml -f trainjob.yaml "
         "-f serve.yaml -f aggregator.yaml -f gateway.yaml\n"
         "The JobSet succeeds when the chief's Job completes (it has told the ps shards and the broker to exit by\n"
         "then) and stays done; a pod that fails restarts in place (OnFailure) and restores the latest checkpoint.",
         runtime),
        ("", train_job),
        network_policy(options, "ps", [PS_PORT + i for i in range(spec.cluster.ps)]),
        network_policy(options, "chief"), network_policy(options, "worker"), *_training_metrics_services(options),
    ])


def reader_component(options):
    task, labels = _tasks(options.spec)["reader", 0], _labels("reader")
    ready = ["sh", "-c", f"zmqflow queues --address tcp://broker:{BROKER_PORT} | grep -q {task.options['queue']}"]
    main = _container(options, "reader", "reader", _args(task), ports=[_port("metrics", task.ports["metrics"])],
                      env=_env(options, task), mounts=[_mount_prepared()], **_dials_out(ready))
    template = _pod_template(options, task, labels, [main], _volumes("prepared"), init_containers=[_data_init(options)])
    return Component("reader", [
        (f"The reader, a Job: it streams the epochs into the broker's queue (--queue {task.options['queue']}), closes "
         "it and exits 0;\nthe Job is then complete and not restarted (more parallelism: more readers join the same "
         f"pipeline, the last to\nfinish closes it). The initContainer prepares the train split of `{options.spec.data}` "
         f"(never the chief's test rows) in the\npod's own emptyDir at {PREPARED}, as the compose file's one-shot "
         "`data` service does; every pod that\nruns it (readers, ps shards, workers) writes the same bytes (seed 0).",
         _job(options, "reader", labels, template)),
        ("The reader's metrics port, for the ServiceMonitor (it serves nothing else).",
         _service(options, "reader", labels, [_metrics_port(task.ports["metrics"])], headless=True)),
        network_policy(options, "reader"),
    ])


def serving_components(options):
    """The model servers (one Deployment + Service each), the aggregator and the gateway (HTTP and gRPC)."""
    job_tasks, replicas = _tasks(options.spec), options.spec.serving.replicas
    serve = []
    for i in range(replicas):
        serve += _served(options, job_tasks["serve", i], "" if i else (
            f"Model servers serve0..serve{replicas - 1}: one Deployment + Service each, so the aggregator names "
            f"its members\n(serve0:{SERVE_PORT}, ...) as in docker-compose.yml. A server starts once the chief's first "
            "checkpoint is in\n/data/ckpt (it restarts until then) and reloads newer ones. It builds the job's model "
            f"({PREPARED}/model.json,\nas the ps and workers do), not code the checkpoint names."),
            mounts=[{"name": "data", "mountPath": DATA_DIR, "readOnly": True}, _mount_prepared()],
            volumes=_volumes("data", "prepared"), init_containers=[_data_init(options)])
    aggregator = _served(options, job_tasks["aggregator", 0],
                         f"The aggregator fronts the {replicas} model servers (one --member each).")
    gateway = _served(options, job_tasks["gateway", 0], (
        "The gateway: the Open Inference Protocol over HTTP (curl, tritonclient.http, KServe's clients) and gRPC\n"
        f"(port grpc, {GATEWAY_GRPC_PORT}: tritonclient.grpc) in front of the aggregator: the ensemble is the model "
        "`ensemble`, each model\nserver a model of its own. Ready while the aggregator answers and a model is ready, "
        "asked over gRPC\n(grpc.health.v1.Health's Check, as the protocol's ServerReady); alive while it serves HTTP "
        "(/v2/health/live):\nthe two probes reach both ports. More replicas share the load; outside the cluster:\n"
        f"kubectl port-forward service/gateway {GATEWAY_PORT} {GATEWAY_GRPC_PORT}."),
        probes={"readiness": _probe(_grpc_check(GATEWAY_GRPC_PORT), 5, 5),
                "liveness": _probe(_http_get("/v2/health/live", "http"), 20, 10, delay=10)})
    return [Component(role, docs + [network_policy(options, role)])
            for role, docs in (("serve", serve), ("aggregator", aggregator), ("gateway", gateway))]


def render(options, curve_files=None):
    """Every component for `options`, in apply order. With options.curve, `curve_files` ({path: bytes},
    from generate_curve_files() or read_curve_files()) become the Secret every pod mounts; without them
    the pods still mount it and the Secret is left out (applied on its own, as for deploy/k8s)."""
    components = [cluster_component(options)]
    if options.curve and curve_files is not None:
        components.append(curve_component(options, curve_files))
    components.append(Component("broker", _served(options, _tasks(options.spec)["broker", 0], (
        "The broker, a Job: it holds the job's queues until the chief tells it to exit (0), then the Job is complete\n"
        "and not restarted (a Deployment started it again, in a loop, once the job was done)."), job=True)
        + [network_policy(options, "broker")]))
    if options.tfjob:
        components.append(tfjob_component(options))
    elif options.trainjob:
        components.append(trainjob_component(options))
    else:
        components += [ps_component(options), worker_component(options)]
    components += [reader_component(options), *serving_components(options), monitoring_component(options)]
    # plain trees: no dict shared between two places (labels, env), so a caller may edit one freely
    return [Component(c.name, [(comment, json.loads(json.dumps(doc))) for comment, doc in c.docs])
            for c in components]


def monitoring_component(options):
    """The Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1): every Service of the job with a
    `metrics` port, each task's metrics under the Prometheus job named by the Service's `job` label."""
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
               "metadata": _metadata(options, APP, {"app": APP}),
               "spec": {"jobLabel": "job", "selector": {"matchLabels": {"app": APP}},
                        "namespaceSelector": {"matchNames": [options.namespace]},
                        "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]}}
    return Component("monitoring", [(
        "For the Prometheus Operator (kube-prometheus-stack): scrape every task's /metrics, through the `metrics`\n"
        "port of its Service (docs/metrics.md lists the metrics). A Prometheus selects ServiceMonitors by its\n"
        "serviceMonitorSelector: add its label here (e.g. release: <its Helm release>) where it asks for one.\n"
        "Without the operator, the pods' prometheus.io annotations serve Prometheus' own Kubernetes discovery.",
        monitor)])


def manifests(options, curve_files=None):
    """Every manifest dict, in apply order."""
    return [doc for component in render(options, curve_files) for _, doc in component.docs]


# ------------------------------------------------------------------ YAML


class _Dumper(yaml.SafeDumper):
    """Block style, sequences indented under their key, multi-line strings as literal blocks, no aliases."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)

    def ignore_aliases(self, data):
        return True


def _represent_str(dumper, value):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)


def to_yaml(doc):
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120,
                     allow_unicode=True)


def _comment(text):
    return "".join(f"# {line}".rstrip() + "\n" for line in text.splitlines()) if text else ""


def header(options, out=None):
    return _comment(f"Generated by `{options.command_line(out)}`:\n"
                    "do not edit by hand; change the options (or jobs/k8s/render.py) and render again.")


def component_text(component):
    return "---\n".join(_comment(comment) + to_yaml(doc) for comment, doc in component.docs)


def render_files(options, curve_files=None, out="DIR"):
    """{file name: YAML text}: one file per component, each with the header naming `out`.

    --tfjob only changes tfjob.yaml, --trainjob only trainjob.yaml (each replaces ps.yaml and worker.yaml): the
    other files name the command without them, so rendering with and without either into one directory gives the
    same files in any order.
    """
    plain = dataclasses.replace(options, tfjob=False, trainjob=False)
    return {f"{c.name}.yaml": header(options if c.name in ("tfjob", "trainjob") else plain, out) + component_text(c)
            for c in render(options, curve_files)}


def render_stream(options, curve_files=None):
    """One multi-document YAML text holding every component (for `kubectl apply -f -`)."""
    return header(options) + "---\n".join(component_text(c) for c in render(options, curve_files))
