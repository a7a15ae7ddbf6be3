"""One JobSpec, rendered every way: the shipped docker-compose.yml, the Kubernetes manifests and the local
processes' task configs hold the same tasks, with the same arguments (parsed by the real commands) and ports."""

import json

import click
import pytest

from tests.deploy.conftest import COMPOSE
from tests.deploy.test_compose_file import parse_zmqflow
from zmqflow.jobs.k8s import render as k8s
from zmqflow.jobs.spec import DEPLOYMENT, Placement, deployment, job_spec, tasks
from zmqflow.jobs.up import compose
from zmqflow.jobs.up.render import render

pytestmark = pytest.mark.unit

# Where the tasks find each other, their files and their results: what differs between the ways by design.
PLACED = {"broker", "ps_endpoints", "task_index", "num_workers", "num_ps", "model_spec", "data_config",
          "result_file", "evaluate", "shutdown_broker", "stats_file", "progress_every", "summary_every_steps",
          "min_after_dequeue", "restore_from", "checkpoint_dir"}

CHIEF_ONLY = {"shutdown_ps", "checkpoint_every_steps", "keep_checkpoints"}   # a deployment's pods all get them


def parse_config(role, options, tmp_path):
    """The params of `zmqflow ROLE --config TASK.json` (the file holding `options`), as the command sees them."""
    path = tmp_path / f"{role}.json"
    path.write_text(json.dumps(options))
    return parse_zmqflow(["zmqflow", role, "--config", str(path)])


def test_the_shipped_compose_file_is_the_rendered_one():
    with open(COMPOSE, encoding="utf-8") as f:
        shipped = f.read()
    assert shipped == render(), "docker-compose.yml differs from the spec's: run `zmqflow compose render`"


def test_one_spec_renders_the_same_tasks_arguments_and_ports_every_way(tmp_path):
    spec = job_spec(DEPLOYMENT, num_ps=3, num_workers=2, batch_size=50)
    deployed = tasks(spec, deployment(spec))
    compose_file = tmp_path / "docker-compose.yml"
    compose_file.write_text(render(spec))
    project = compose.load(str(compose_file), env={})
    manifests = k8s.manifests(k8s.Options(spec, curve=False))
    containers = {d["metadata"]["name"]: d["spec"]["template"]["spec"] for d in manifests
                  if d["kind"] in ("StatefulSet", "Deployment", "Job")}
    names = {t.name if t.role != "reader" else "reader" for t in deployed}
    assert names == set(project.services) - {"loadtest", "loadtest-http", "dashboard"}
    assert {t.role for t in deployed} - {"keys"} <= {name.rstrip("0123456789") for name in containers} | {"data"}
    for task in deployed:
        service = project.services[task.name if task.role != "reader" else "reader"]
        params = parse_zmqflow(task.argv())
        assert parse_zmqflow(service.command) == params, task.name                      # compose: the same arguments
        assert service.expose == list(task.ports.values()), task.name                    # and ports
        assert {k: v for k, v in service.environment.items() if k in task.env} == task.env, task.name
        pod = containers.get({"ps": "ps", "worker": "chief" if task.index == 0 else "worker"}.get(task.role, task.name))
        if task.role == "data":
            pod = containers["reader"]
        if pod is None or task.role == "ps" and task.index or task.role == "worker" and task.index > 1:
            continue               # a StatefulSet's pods run its first task's command (TF_CONFIG and env set the rest)
        main = (pod["initContainers"] if task.role == "data" else pod["containers"])[0]
        argv = [a.replace(k8s.PREPARED, "/data/prepared") for a in main["args"]]
        k8s_params = parse_zmqflow(["zmqflow", *argv])
        if task.role == "data":
            k8s_params["data_spec"], k8s_params["model_spec"] = params["data_spec"], params["model_spec"]
            assert k8s_params == {**params, "out_dir": "/data/prepared"}
            continue
        assert k8s_params == params, task.name                                           # Kubernetes: the same
        assert {p["containerPort"] for p in main.get("ports", [])} >= {task.ports["metrics"]} - {None}, task.name
    local = tasks(spec, Placement("tcp://127.0.0.1:5555", ps=("tcp://127.0.0.1:1", "tcp://127.0.0.1:2",
                                                                 "tcp://127.0.0.1:3"), prepared="/tmp/p",
                                   log_dir="/tmp/l", train_rows=4500))
    assert [(t.role, t.index) for t in local] == [(t.role, t.index) for t in deployed
                                                  if t.role in ("ps", "reader", "worker")]
    for here, there in zip(local, [t for t in deployed if t.role in ("ps", "reader", "worker")]):
        mine, theirs = parse_config(here.role, here.config(), tmp_path), parse_zmqflow(there.argv())
        for key in set(mine) | set(theirs):       # local processes: the same training arguments, --config
            if key not in PLACED and not (here.role == "worker" and here.index and key in CHIEF_ONLY):
                assert mine.get(key) == theirs.get(key), (here.name, key)
    chief = parse_config("worker", local[-2].config(), tmp_path)
    assert chief["ps_endpoints"] == ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2", "tcp://127.0.0.1:3")
    assert chief["batch_size"] == 50 and chief["task_index"] == 0 and chief["num_workers"] == 2


def test_a_task_config_names_an_option_the_command_lacks(tmp_path):
    path = tmp_path / "ps.json"
    path.write_text(json.dumps({"model": "mlp", "batch-size": 100}))
    with pytest.raises(click.BadParameter, match="'batch-size' is not an option of `ps`"):
        parse_zmqflow(["zmqflow", "ps", "--config", str(path)])
    path.write_text(json.dumps({"examples-per-epoch": 100, "batch-size": 7}))     # the worker's config-only field
    assert parse_zmqflow(["zmqflow", "worker", "--config", str(path), "--batch-size", "9"])["batch_size"] == 9
