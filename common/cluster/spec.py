"""The cluster: which address each task of each job listens on (tf.train.ClusterSpec, TF_CONFIG).

Every task reads the same description (a YAML/JSON file, `--job NAME=ADDR,...` flags, or
Kubeflow's TF_CONFIG) and calls `validate()` before it binds anything, so a typo in the
cluster is reported once, naming the job, the task and the address, instead of surfacing
later as a task that never answers.

Decisions where TensorFlow is loose:
- Constructing a ClusterSpec only checks its shape (jobs map to lists or {index: address});
  `validate()` checks the contents, so tests and tools can hold an unchecked spec.
- Looking up a job or task that is not there raises NotFoundError; configuration that is
  wrong (validate, TF_CONFIG, files, flags) raises InvalidArgumentError.
- A TF_CONFIG that is unset, empty or "{}" means "no cluster": from_tf_config returns None.
- In TF_CONFIG the task index defaults to 0 when only the type is given (as TF's RunConfig).
- The chief is task "chief" (or TF1's "master") 0; without such a job it is worker 0.
"""

import json
import os
import re
from collections.abc import Mapping
from typing import NamedTuple

from zmqflow.common.cluster.device import JOB_NAME
from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.common.spec_files import read_spec_documents

TF_CONFIG_KEYS = frozenset({"cluster", "task", "environment", "rpc_layer"})
CHIEF_JOBS = ("chief", "master")
_HOST = re.compile(r"[A-Za-z0-9_.\-]+\Z")


def _index(value, what):
    """A task index: a non-negative int, or a numeric string as JSON/YAML keys are."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidArgumentError(f"{what}: task index {value!r} is not a non-negative integer")


def _job_tasks(job, tasks):
    """One job's tasks as {index: address}, sorted; only the shape is checked here."""
    if not isinstance(job, str):
        raise InvalidArgumentError(f"job name {job!r} is not a string")
    if isinstance(tasks, (list, tuple)):
        pairs = list(enumerate(tasks))
    elif isinstance(tasks, Mapping):
        pairs = [(_index(i, f"job {job!r}"), address) for i, address in tasks.items()]
    else:
        raise InvalidArgumentError(
            f"job {job!r}: tasks must be a list of 'host:port' addresses or a mapping from "
            f"task index to address, not {tasks!r}")
    for i, address in pairs:
        if not isinstance(address, str):
            raise InvalidArgumentError(f"job {job!r} task {i}: address {address!r} is not a 'host:port' string")
    if len({i for i, _ in pairs}) != len(pairs):
        raise InvalidArgumentError(f"job {job!r}: a task index is given twice")
    return dict(sorted(pairs))


def split_address(address):
    """'host:port' -> (host, port string); '[::1]:5' -> ('::1', '5'); port is None if absent."""
    host, sep, port = address.rpartition(":")
    if not sep or (address.startswith("[") and not host.endswith("]")):
        return address, None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def join_address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _address_problem(address, allow_port_zero):
    """Why `address` cannot be bound or dialled, or None if it can."""
    if "://" in address:
        return "must be host:port, without a scheme"
    host, port = split_address(address)
    if port is None:
        return "has no port (expected host:port)"
    if not host:
        return "has an empty host"
    if not (_HOST.match(host) or (":" in host and address.startswith("["))):
        return f"host {host!r} is not a host name or IP address (IPv6 goes in brackets)"
    if not port.isdigit():
        return f"port {port!r} is not a number"
    if int(port) == 0 and not allow_port_zero:
        return "port 0 (any free port) is not allowed here"
    if int(port) > 65535:
        return f"port {port} is out of range 1..65535"
    return None


class ClusterSpec:
    """Jobs -> task indices -> 'host:port', as tf.train.ClusterSpec (dense lists or sparse dicts)."""

    def __init__(self, cluster=None):
        if isinstance(cluster, ClusterSpec):
            cluster = cluster.as_dict()
        if cluster is None:
            cluster = {}
        if not isinstance(cluster, Mapping):
            raise InvalidArgumentError(f"a cluster spec maps job names to task addresses, not {cluster!r}")
        by_name = sorted(cluster.items(), key=lambda kv: str(kv[0]))
        self._jobs = {job: _job_tasks(job, tasks) for job, tasks in by_name}

    # -- loading ------------------------------------------------------------------

    @classmethod
    def from_file(cls, path):
        """A YAML or JSON file holding the cluster dict, a TF_CONFIG-shaped doc (its task is ignored), or
        Kubernetes manifests with the ConfigMap `zmqflow k8s render` writes (`cluster.json` in its data:
        deploy/k8s/cluster.yaml)."""
        path = os.fspath(path)
        docs = read_spec_documents(path, "cluster spec file")
        doc = _configmap_cluster(path, docs) if any(_is_manifest(d) for d in docs) or len(docs) > 1 else \
            (docs[0] if docs else None)
        if not isinstance(doc, Mapping):
            raise InvalidArgumentError(f"cluster spec file {path} does not hold a mapping of jobs to addresses")
        if _is_tf_config_doc(doc):
            doc = doc["cluster"]
        try:
            return cls(doc)
        except InvalidArgumentError as e:
            raise InvalidArgumentError(f"cluster spec file {path}: {e}") from None

    @classmethod
    def from_flags(cls, flags):
        """From repeated `--job NAME=HOST:PORT,HOST:PORT` values; a job named twice gets both lists."""
        jobs = {}
        for flag in flags:
            job, sep, addresses = flag.partition("=")
            job, addresses = job.strip(), [a.strip() for a in addresses.split(",") if a.strip()]
            if not sep or not job or not addresses:
                raise InvalidArgumentError(f"--job {flag!r} is not NAME=HOST:PORT[,HOST:PORT...]")
            jobs.setdefault(job, []).extend(addresses)
        return cls(jobs)

    @classmethod
    def from_tf_config(cls, env=None):
        """The TaskConfig in the TF_CONFIG environment variable, or None if it is unset or "{}"."""
        raw = (os.environ if env is None else env).get("TF_CONFIG", "")
        if not raw.strip():
            return None
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise InvalidArgumentError(f"TF_CONFIG is not valid JSON: {e}") from None
        return _task_config(doc, "TF_CONFIG")

    # -- looking up ---------------------------------------------------------------

    @property
    def jobs(self):
        return list(self._jobs)

    def _tasks_of(self, job):
        if job not in self._jobs:
            raise NotFoundError(f"the cluster has no job {job!r} (jobs: {', '.join(self._jobs) or 'none'})")
        return self._jobs[job]

    def num_tasks(self, job):
        return len(self._tasks_of(job))

    def task_indices(self, job):
        return list(self._tasks_of(job))

    def job_tasks(self, job):
        """Addresses by index, None where a sparse job has no task (as TF)."""
        tasks = self._tasks_of(job)
        return [tasks.get(i) for i in range(max(tasks, default=-1) + 1)]

    def task_address(self, job, index):
        tasks = self._tasks_of(job)
        if index not in tasks:
            raise NotFoundError(f"job {job!r} has no task {index!r} (tasks: {_indices(tasks)})")
        return tasks[index]

    def endpoint(self, job, index):
        """The ZeroMQ endpoint of a task: 'tcp://host:port'."""
        return "tcp://" + self.task_address(job, index)

    def tasks(self):
        """Every (job, index, address), jobs sorted by name, tasks by index."""
        return [(job, i, address) for job, tasks in self._jobs.items() for i, address in tasks.items()]

    def as_dict(self):
        """{job: [addresses]} for dense jobs, {job: {index: address}} for sparse ones (as TF)."""
        return {job: list(tasks.values()) if list(tasks) == list(range(len(tasks))) else dict(tasks)
                for job, tasks in self._jobs.items()}

    def to_tf_config(self, task_type, index):
        """The TF_CONFIG JSON string that makes a process task `index` of job `task_type`."""
        self.validate_task(task_type, index)
        return json.dumps({"cluster": self.as_dict(), "task": {"type": task_type, "index": index}})

    def resolve_hosts(self, mapping):
        """A copy with hosts renamed by `mapping` (a dict, or a function of the host), ports kept.

        `zmqflow up` maps the compose service names to 127.0.0.1; validate() afterwards then
        reports two tasks that would now share a port.
        """
        rename = mapping if callable(mapping) else (lambda host: mapping.get(host, host))

        def resolve(address):
            host, port = split_address(address)
            return address if port is None else join_address(rename(host), port)
        return ClusterSpec({job: {i: resolve(a) for i, a in tasks.items()} for job, tasks in self._jobs.items()})

    # -- checking -----------------------------------------------------------------

    def validate(self, require_dense=False, allow_port_zero=False):
        """Raise InvalidArgumentError listing every problem; returns self so it can be chained.

        require_dense: task indices of every job must be 0..n-1 (no gaps).
        allow_port_zero: port 0 (bind any free port) is accepted, as in tests.
        """
        problems, seen = [], {}
        for job, tasks in self._jobs.items():
            if not JOB_NAME.match(job):
                problems.append(f"job name {job!r} is not valid: it must match [A-Za-z][A-Za-z0-9_]*")
            if job in CHIEF_JOBS and len(tasks) > 1:
                problems.append(f"job {job!r} has {len(tasks)} tasks ({_indices(tasks)}); there is one chief")
            if require_dense:
                problems += [f"job {job!r} has no task {i} (tasks given: {_indices(tasks)}; "
                             "indices must be 0..n-1)"
                             for i in range(max(tasks, default=-1) + 1) if i not in tasks]
            for i, address in tasks.items():
                problem = _address_problem(address, allow_port_zero)
                if problem:
                    problems.append(f"job {job!r} task {i} address {address!r} {problem}")
                    continue
                host, port = split_address(address)
                key = (host.lower(), int(port))
                if key in seen and port != "0":
                    other_job, other_i = seen[key]
                    problems.append(f"address {address!r} is used by both job {other_job!r} task {other_i} "
                                    f"and job {job!r} task {i}")
                seen.setdefault(key, (job, i))
        if problems:
            raise InvalidArgumentError("invalid cluster spec:\n  " + "\n  ".join(problems))
        return self

    def validate_task(self, task_type, index):
        """InvalidArgumentError unless the cluster has task `index` of job `task_type`."""
        if task_type not in self._jobs:
            raise InvalidArgumentError(f"task type {task_type!r} (index {index!r}) is not a job of the cluster "
                                       f"(jobs: {', '.join(self._jobs) or 'none'})")
        if index not in self._jobs[task_type]:
            raise InvalidArgumentError(
                f"task {task_type!r} index {index!r} is not in the cluster (job {task_type!r} has tasks "
                f"{_indices(self._jobs[task_type])})")

    # -- showing ------------------------------------------------------------------

    def table(self):
        """The resolved cluster as an aligned text table, printed at start-up."""
        rows = [("job", "task", "address")] + [(job, str(i), a) for job, i, a in self.tasks()]
        if len(rows) == 1:
            return "(empty cluster)"
        widths = [max(len(row[c]) for row in rows) for c in range(2)]
        return "\n".join(f"{job:<{widths[0]}}  {i:>{widths[1]}}  {a}".rstrip() for job, i, a in rows)

    def __eq__(self, other):
        if isinstance(other, Mapping):
            try:
                other = ClusterSpec(other)
            except InvalidArgumentError:
                return False
        if not isinstance(other, ClusterSpec):
            return NotImplemented
        return self._jobs == other._jobs

    __hash__ = None

    def __bool__(self):
        return bool(self._jobs)

    def __repr__(self):
        return f"ClusterSpec({self.as_dict()!r})"


class TaskConfig(NamedTuple):
    """Who this process is: the cluster, its job and its index (index None when type is None)."""
    cluster: ClusterSpec
    task_type: str | None
    task_index: int | None

    @property
    def is_chief(self):
        if self.task_type in CHIEF_JOBS:
            return True
        has_chief = any(job in self.cluster.jobs for job in CHIEF_JOBS)
        return self.task_type == "worker" and self.task_index == 0 and not has_chief

    @property
    def address(self):
        return self.cluster.task_address(self.task_type, self.task_index)

    @property
    def endpoint(self):
        return self.cluster.endpoint(self.task_type, self.task_index)


def _indices(tasks):
    return ", ".join(map(str, tasks)) or "none"


def _is_manifest(doc):
    return isinstance(doc, Mapping) and "apiVersion" in doc and "kind" in doc


def _configmap_cluster(path, docs):
    """The cluster dict in the `cluster.json` of a ConfigMap among Kubernetes manifests (k8s render's cluster.yaml)."""
    for doc in docs:
        data = doc.get("data") if _is_manifest(doc) and doc["kind"] == "ConfigMap" else None
        if isinstance(data, Mapping) and "cluster.json" in data:
            try:
                return json.loads(data["cluster.json"])
            except (TypeError, ValueError) as e:
                raise InvalidArgumentError(f"cluster spec file {path}: ConfigMap "
                                           f"{doc.get('metadata', {}).get('name')!r}: cluster.json is not JSON: {e}") \
                    from None
    kinds = ", ".join(str(d.get("kind", "no kind")) if isinstance(d, Mapping) else type(d).__name__ for d in docs)
    raise InvalidArgumentError(f"cluster spec file {path} holds {len(docs)} YAML documents ({kinds}) and none is a "
                               "ConfigMap with a cluster.json (as `zmqflow k8s render` writes): give one mapping of "
                               "job names to task addresses")


def _is_tf_config_doc(doc):
    """A doc shaped like TF_CONFIG ({"cluster": {...}, "task": ...}) rather than a bare cluster dict."""
    cluster = doc.get("cluster")
    return (isinstance(cluster, Mapping) and set(doc) <= TF_CONFIG_KEYS
            and all(isinstance(tasks, (list, tuple, Mapping)) for tasks in cluster.values()))


def _task_config(doc, source):
    """TaskConfig from a parsed TF_CONFIG; every error message starts with `source`."""
    if not isinstance(doc, Mapping):
        raise InvalidArgumentError(f"{source} must be a JSON object with 'cluster' and 'task', not {doc!r}")
    if "cluster" not in doc and "task" not in doc:
        return None
    try:
        if "cluster" not in doc:
            raise InvalidArgumentError("it has a 'task' but no 'cluster'")
        cluster = ClusterSpec(doc["cluster"])
        task = doc.get("task") or {}
        if not isinstance(task, Mapping):
            raise InvalidArgumentError(f"'task' must be an object with 'type' and 'index', not {task!r}")
        task_type = task.get("type")
        if task_type is None:
            return TaskConfig(cluster, None, None)
        if not isinstance(task_type, str):
            raise InvalidArgumentError(f"task type {task_type!r} is not a string")
        index = _index(task.get("index", 0), f"task {task_type!r}")
        cluster.validate_task(task_type, index)
        return TaskConfig(cluster, task_type, index)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"{source}: {e}") from None
