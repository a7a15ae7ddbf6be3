"""ClusterSpec and TF_CONFIG: construction as tf.train.ClusterSpec, validation with named errors."""

import json

import pytest

from zmqflow.common.cluster.spec import ClusterSpec, TaskConfig
from zmqflow.common.errors import InvalidArgumentError, NotFoundError

pytestmark = pytest.mark.unit

CLUSTER = {"chief": ["chief:2222"], "ps": ["ps0:2222", "ps1:2222"], "worker": {0: "w0:2222", 2: "w2:2222"}}


def test_dense_and_sparse_jobs_as_tf():
    c = ClusterSpec(CLUSTER)
    assert c.jobs == ["chief", "ps", "worker"]
    assert c.num_tasks("ps") == 2 and c.num_tasks("worker") == 2
    assert c.task_indices("worker") == [0, 2]
    assert c.task_address("worker", 2) == "w2:2222"
    assert c.job_tasks("worker") == ["w0:2222", None, "w2:2222"]
    assert c.endpoint("ps", 1) == "tcp://ps1:2222"
    assert c.as_dict() == CLUSTER
    assert c.tasks()[0] == ("chief", 0, "chief:2222")


def test_numeric_string_task_keys_as_tf():
    assert ClusterSpec({"worker": {"0": "w0:1", "2": "w2:1"}}) == ClusterSpec({"worker": {0: "w0:1", 2: "w2:1"}})


def test_equality_with_specs_and_dicts():
    c = ClusterSpec(CLUSTER)
    assert c == ClusterSpec(CLUSTER) == ClusterSpec(c)
    assert c == CLUSTER
    assert c != ClusterSpec({"ps": ["ps0:2222"]})
    assert c != {"ps": "not a list"}
    assert not ClusterSpec() and ClusterSpec() == ClusterSpec({})


@pytest.mark.parametrize("bad", [
    {"ps": "h:1"}, {"ps": [1234]}, {"worker": {"x": "h:1"}}, {"worker": {-1: "h:1"}},
    {"worker": {0: "h:1", "0": "h:2"}}, {1: ["h:1"]}, ["ps", "h:1"],
])
def test_malformed_shape_is_rejected_at_construction(bad):
    with pytest.raises(InvalidArgumentError):
        ClusterSpec(bad)


def test_lookup_of_missing_job_or_task():
    c = ClusterSpec(CLUSTER)
    with pytest.raises(NotFoundError, match="'evaluator'.*chief, ps, worker"):
        c.task_address("evaluator", 0)
    with pytest.raises(NotFoundError, match=r"'worker' has no task 1 \(tasks: 0, 2\)"):
        c.endpoint("worker", 1)


def test_valid_cluster_passes_and_chains():
    c = ClusterSpec(CLUSTER)
    assert c.validate() is c
    ClusterSpec({"worker": ["[::1]:5000", "127.0.0.1:5001", "a_b.example.com:65535"]}).validate()


def test_duplicate_address_names_both_tasks():
    c = ClusterSpec({"ps": ["h:1"], "worker": ["h:2", "H:1"]})
    with pytest.raises(InvalidArgumentError) as info:
        c.validate()
    assert "'H:1' is used by both job 'ps' task 0 and job 'worker' task 1" in str(info.value)


def test_missing_task_when_dense_required():
    c = ClusterSpec({"worker": {0: "w:1", 2: "w:2", 4: "w:3"}})
    c.validate()  # sparse is fine by default, as TF
    with pytest.raises(InvalidArgumentError) as info:
        c.validate(require_dense=True)
    assert "job 'worker' has no task 1" in str(info.value)
    assert "job 'worker' has no task 3" in str(info.value)


@pytest.mark.parametrize("address, why", [
    ("h:http", "port 'http' is not a number"),
    ("h:70000", "out of range 1..65535"),
    ("h:0", "port 0"),
    ("h", "has no port"),
    (":2222", "empty host"),
    ("bad host:1", "not a host name"),
    ("tcp://h:1", "without a scheme"),
    ("::1:5000", "IPv6 goes in brackets"),
])
def test_bad_address_names_job_task_and_address(address, why):
    c = ClusterSpec({"ps": ["ok:1"], "worker": ["ok:2", address]})
    with pytest.raises(InvalidArgumentError) as info:
        c.validate()
    message = str(info.value)
    assert f"job 'worker' task 1 address {address!r}" in message
    assert why in message


def test_port_zero_only_when_allowed():
    c = ClusterSpec({"ps": ["127.0.0.1:0"], "worker": ["127.0.0.1:0"]})
    with pytest.raises(InvalidArgumentError, match="port 0"):
        c.validate()
    c.validate(allow_port_zero=True)  # port 0 tasks never collide: each binds its own free port


@pytest.mark.parametrize("job", ["Worker-1", "1ps", "", "ps job"])
def test_bad_job_name(job):
    with pytest.raises(InvalidArgumentError, match=f"job name {job!r} is not valid"):
        ClusterSpec({job: ["h:1"]}).validate()


def test_more_than_one_chief():
    with pytest.raises(InvalidArgumentError, match="job 'chief' has 2 tasks"):
        ClusterSpec({"chief": ["c:1", "c:2"]}).validate()


def test_validate_lists_every_problem():
    c = ClusterSpec({"ps": ["h:1", "h:x"], "worker": ["h:1", ":3"]})
    with pytest.raises(InvalidArgumentError) as info:
        c.validate()
    assert str(info.value).count("\n") == 3


def test_from_flags():
    c = ClusterSpec.from_flags(["ps=h:1,h:2", "worker=h:3", " worker = h:4 "])
    assert c.as_dict() == {"ps": ["h:1", "h:2"], "worker": ["h:3", "h:4"]}


@pytest.mark.parametrize("flag", ["ps", "ps=", "=h:1", "ps=,"])
def test_bad_flag(flag):
    with pytest.raises(InvalidArgumentError, match="NAME=HOST:PORT"):
        ClusterSpec.from_flags([flag])


@pytest.mark.parametrize("name, text", [
    ("cluster.yaml", "ps: [ps0:2222, ps1:2222]\nchief:\n  - chief:2222\nworker:\n  0: w0:2222\n  2: w2:2222\n"),
    ("cluster.yml", "cluster:\n  ps: [ps0:2222, ps1:2222]\n  chief: [chief:2222]\n"
                    "  worker: {0: w0:2222, 2: w2:2222}\n"
                    "task: {type: worker, index: 0}\n"),
    ("cluster.json", json.dumps(CLUSTER)),
    ("tf_config.json", json.dumps({"cluster": CLUSTER, "task": {"type": "ps", "index": 1}})),
    ("cluster.conf", json.dumps(CLUSTER)),
    ("cluster", "ps: [ps0:2222, ps1:2222]\nchief: [chief:2222]\nworker: {'0': w0:2222, '2': w2:2222}\n"),
])
def test_from_file_yaml_json_bare_or_tf_config(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert ClusterSpec.from_file(path) == CLUSTER


@pytest.mark.parametrize("name, text, why", [
    ("c.json", "{not json", "not valid JSON"),
    ("c.yaml", "ps: [a, b\n", "not valid YAML"),
    ("c.yaml", "", "does not hold a mapping"),
    ("c.yaml", "- h:1\n", "does not hold a mapping"),
    ("c.yaml", "ps: h:1\n", "tasks must be a list"),
])
def test_bad_file(tmp_path, name, text, why):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InvalidArgumentError, match=why) as info:
        ClusterSpec.from_file(path)
    assert str(path) in str(info.value)


def test_from_the_configmap_k8s_render_writes():
    """deploy/k8s/cluster.yaml (Namespace, ConfigMap with cluster.json, claim): `cluster check --cluster` takes it."""
    import os
    shipped = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "k8s", "cluster.yaml")
    spec = ClusterSpec.from_file(shipped)
    assert spec.task_address("ps", 1) == "ps-1.ps:5601" and spec.task_address("chief", 0) == "chief-0.chief:5610"


@pytest.mark.parametrize("text, why", [
    ("a: 1\n---\nb: 2\n", r"holds 2 YAML documents \(no kind, no kind\) and none is a ConfigMap with a cluster.json"),
    ("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n", r"\(Namespace\) and none is a ConfigMap"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {cluster.json: '{no'}\n",
     r"ConfigMap 'c': cluster.json is not JSON"),
])
def test_manifests_without_a_cluster_are_refused_saying_what_they_hold(tmp_path, text, why):
    path = tmp_path / "manifests.yaml"
    path.write_text(text)
    with pytest.raises(InvalidArgumentError, match=why):
        ClusterSpec.from_file(path)


def test_missing_file(tmp_path):
    with pytest.raises(NotFoundError, match="nope.yaml"):
        ClusterSpec.from_file(tmp_path / "nope.yaml")


def test_tf_config_round_trip():
    c = ClusterSpec(CLUSTER)
    env = {"TF_CONFIG": c.to_tf_config("worker", 2)}
    task = ClusterSpec.from_tf_config(env)
    assert task == (c, "worker", 2)
    cluster, task_type, index = task
    assert isinstance(task, TaskConfig) and cluster == c and (task_type, index) == ("worker", 2)
    assert task.address == "w2:2222" and task.endpoint == "tcp://w2:2222"
    assert json.loads(env["TF_CONFIG"])["cluster"]["worker"] == {"0": "w0:2222", "2": "w2:2222"}


def test_tf_config_from_kubeflow():
    env = {"TF_CONFIG": json.dumps({
        "cluster": {"chief": ["t-chief-0:2222"], "ps": ["t-ps-0:2222"], "worker": ["t-worker-0:2222"]},
        "task": {"type": "ps", "index": "0"}, "environment": "cloud"})}
    task = ClusterSpec.from_tf_config(env)
    assert (task.task_type, task.task_index, task.address) == ("ps", 0, "t-ps-0:2222")
    task.cluster.validate()


def test_tf_config_reads_os_environ(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker"}}))
    assert ClusterSpec.from_tf_config() == (ClusterSpec({"worker": ["h:1"]}), "worker", 0)
    monkeypatch.delenv("TF_CONFIG")
    assert ClusterSpec.from_tf_config() is None


@pytest.mark.parametrize("raw", ["", "  ", "{}"])
def test_tf_config_absent_means_no_cluster(raw):
    assert ClusterSpec.from_tf_config({"TF_CONFIG": raw}) is None
    assert ClusterSpec.from_tf_config({}) is None


def test_tf_config_without_task_is_a_client():
    task = ClusterSpec.from_tf_config({"TF_CONFIG": json.dumps({"cluster": {"ps": ["h:1"]}})})
    assert task == (ClusterSpec({"ps": ["h:1"]}), None, None)
    assert not task.is_chief


@pytest.mark.parametrize("raw, why", [
    ("{not json", "TF_CONFIG is not valid JSON"),
    ("[1, 2]", "TF_CONFIG must be a JSON object"),
    ('{"task": {"type": "worker", "index": 0}}', "TF_CONFIG: it has a 'task' but no 'cluster'"),
    ('{"cluster": {"worker": "h:1"}}', "TF_CONFIG: job 'worker': tasks must be a list"),
    ('{"cluster": {"worker": ["h:1"]}, "task": "worker"}', "TF_CONFIG: 'task' must be an object"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": 1}}', "TF_CONFIG: task type 1 is not a string"),
    ('{"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": -1}}',
     "TF_CONFIG: task 'worker': task index -1"),
])
def test_malformed_tf_config(raw, why):
    with pytest.raises(InvalidArgumentError, match=why):
        ClusterSpec.from_tf_config({"TF_CONFIG": raw})


@pytest.mark.parametrize("task, why", [
    ({"type": "evaluator", "index": 0}, "TF_CONFIG: task type 'evaluator' .* not a job of the cluster"),
    ({"type": "worker", "index": 1}, r"TF_CONFIG: task 'worker' index 1 is not in the cluster .*tasks 0, 2"),
])
def test_tf_config_task_not_in_cluster(task, why):
    raw = json.dumps({"cluster": CLUSTER, "task": task})
    with pytest.raises(InvalidArgumentError, match=why):
        ClusterSpec.from_tf_config({"TF_CONFIG": raw})


def test_to_tf_config_rejects_unknown_task():
    with pytest.raises(InvalidArgumentError, match="'worker' index 5"):
        ClusterSpec(CLUSTER).to_tf_config("worker", 5)


@pytest.mark.parametrize("cluster, task_type, index, chief", [
    (CLUSTER, "chief", 0, True),
    (CLUSTER, "worker", 0, False),
    ({"master": ["m:1"], "worker": ["w:1"]}, "master", 0, True),
    ({"ps": ["p:1"], "worker": ["w:1", "w:2"]}, "worker", 0, True),
    ({"ps": ["p:1"], "worker": ["w:1", "w:2"]}, "worker", 1, False),
    ({"ps": ["p:1"], "worker": ["w:1", "w:2"]}, "ps", 0, False),
])
def test_chief_as_tf(cluster, task_type, index, chief):
    assert TaskConfig(ClusterSpec(cluster), task_type, index).is_chief is chief


def test_resolve_hosts_maps_to_loopback():
    c = ClusterSpec({"ps": ["ps0:2222", "ps1:2223"], "worker": ["worker0:2224", "[::1]:2225"]})
    local = c.resolve_hosts({"ps0": "127.0.0.1", "ps1": "127.0.0.1", "worker0": "localhost"})
    assert local.as_dict() == {"ps": ["127.0.0.1:2222", "127.0.0.1:2223"],
                               "worker": ["localhost:2224", "[::1]:2225"]}
    assert c.task_address("ps", 0) == "ps0:2222"  # the original is unchanged
    v6 = c.resolve_hosts(lambda host: "::1")
    assert v6.endpoint("ps", 1) == "tcp://[::1]:2223"
    v6.validate()


def test_resolve_hosts_then_validate_finds_port_clash():
    compose = ClusterSpec({"ps": ["ps0:2222", "ps1:2222"]})
    compose.validate()
    clash = "'127.0.0.1:2222' is used by both job 'ps' task 0 and job 'ps' task 1"
    with pytest.raises(InvalidArgumentError, match=clash):
        compose.resolve_hosts(lambda host: "127.0.0.1").validate()


def test_table():
    table = ClusterSpec(CLUSTER).table()
    assert table.splitlines() == [
        "job     task  address",
        "chief      0  chief:2222",
        "ps         0  ps0:2222",
        "ps         1  ps1:2222",
        "worker     0  w0:2222",
        "worker     2  w2:2222",
    ]
    assert ClusterSpec().table() == "(empty cluster)"
