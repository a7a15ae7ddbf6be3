"""docker-compose.yml: every service runnable as written, checked against the real CLIs."""

import shlex

import click
import pytest
import yaml

from zmqflow.common import metrics
from zmqflow.common.cluster import ClusterSpec
from zmqflow.common.cli_support import METRICS_PORT_ENV
from zmqflow.cli.main import main
from tests.deploy.conftest import COMPOSE, compose_ports

pytestmark = pytest.mark.unit

TOPOLOGY = {"data", "broker", "ps0", "ps1", "reader", "worker0", "worker1", "serve0", "serve1", "serve2", "aggregator"}
PROFILED = {"loadtest"}   # runs only with its profile


def parse_zmqflow(argv):
    """Parse `zmqflow SUB ... ARGS` with the real click commands (options, types, choices)."""
    assert argv[0] == "zmqflow", argv
    command, args, ctx = main, list(argv[1:]), None
    while isinstance(command, click.Group):
        name = args.pop(0)
        sub = command.get_command(click.Context(command), name)
        assert sub is not None, f"`zmqflow {name}` (in {' '.join(argv)}) is not a registered command"
        command = sub
    requested = dict(metrics._requested)   # the --metrics-port callback records it for this process
    try:
        with command.make_context(command.name, args) as ctx:
            return ctx.params
    finally:
        metrics._requested.update(requested)


def test_topology_services_and_shared_block(project):
    assert set(project.services) == TOPOLOGY | PROFILED
    with open(COMPOSE) as f:
        text = f.read()
    raw = yaml.safe_load(text)
    anchors = [key for key in raw if key.startswith("x-")]
    assert "x-zmqflow" in anchors
    assert text.count("<<: *zmqflow") == len(TOPOLOGY | PROFILED)   # every service takes the shared block
    for name, spec in project.raw["services"].items():
        assert spec["volumes"] == ["zmqflow-data:/data", "./deploy/user:/user:ro"], name
        assert spec["image"] == "zmqflow:latest"
    assert project.volumes == ["zmqflow-data"]


ONE_SHOT = {"data", "loadtest"}        # exit 0 when done, no healthcheck
COMPLETES = {"data", "worker0"}         # dependents wait for service_completed_successfully


def test_every_service_has_command_healthcheck_and_valid_dependencies(project):
    for name, service in project.services.items():
        assert service.command[0] == "zmqflow", name   # the image's entrypoint, then the compose command
        assert project.raw["services"][name]["command"][0] != "zmqflow", name
        if name in ONE_SHOT:
            assert service.healthcheck is None, name
            continue
        assert service.healthcheck is not None and service.healthcheck.test, name
        assert "curl" not in " ".join(service.healthcheck.test)
        for dep, condition in service.depends_on.items():
            assert dep in project.services
            if dep in COMPLETES:
                assert condition == "service_completed_successfully", (name, dep)
                continue
            assert condition == "service_healthy", (name, dep)
            assert project.services[dep].healthcheck is not None
    assert not project.services["broker"].depends_on
    assert project.services["ps0"].depends_on == {"data": "service_completed_successfully"}   # its model.json
    assert set(project.services["worker0"].depends_on) == {"broker", "ps0", "ps1"}


def test_ports_unique_and_each_service_binds_its_own(project):
    ports = compose_ports(project)
    assert len(ports) == len(set(ports))
    assert ports == [5555, 5600, 5601, 5700, 5701, 5702, 5800, 6555, 6600, 6601, 6610, 6611, 6620, 6700, 6701, 6702,
                     6800]
    for name in ("broker", "serve0", "serve1", "serve2", "aggregator"):
        service = project.services[name]
        bind = service.command[service.command.index("--bind") + 1]
        assert bind == f"tcp://0.0.0.0:{service.expose[0]}"
        assert f"tcp://127.0.0.1:{service.expose[0]}" in service.healthcheck.test


def metrics_port(service):
    """The service's --metrics-port, from its command or its ZMQFLOW_METRICS_PORT."""
    if "--metrics-port" in service.command:
        return service.command[service.command.index("--metrics-port") + 1]
    return service.environment.get(METRICS_PORT_ENV)


def test_every_long_running_service_exposes_prometheus_metrics_on_its_port_plus_1000(project):
    for name, service in project.services.items():
        if name in ONE_SHOT:
            continue
        port = int(service.expose[-1])
        assert metrics_port(service) == f"0.0.0.0:{port}", name     # every interface of its container
        if len(service.expose) == 2:
            assert port == service.expose[0] + 1000, name


def test_tf_config_cluster_matches_the_services(project):
    configs = {}
    for name, service in project.services.items():
        if "TF_CONFIG" in service.environment:
            configs[name] = ClusterSpec.from_tf_config({"TF_CONFIG": service.environment["TF_CONFIG"]})
    assert set(configs) == {"ps0", "ps1", "worker0", "worker1"}
    clusters = {repr(task.cluster) for task in configs.values()}
    assert len(clusters) == 1
    for name, task in configs.items():
        task.cluster.validate(require_dense=True)
        assert f"{task.task_type}{task.task_index}" == name
        host, port = task.address.split(":")
        assert host == name
        assert int(port) + 1000 == project.services[name].expose[-1]   # its port, and its metrics one above
    assert configs["worker0"].is_chief and not configs["worker1"].is_chief
    assert task.cluster.job_tasks("broker") == ["broker:5555"]


def test_commands_parse_with_the_real_clis(project):
    for name, service in project.services.items():
        params = parse_zmqflow(service.command)
        assert params, name
    assert parse_zmqflow(project.services["reader"].command)["num_epochs"] == 5
    chief = parse_zmqflow(project.services["worker0"].command)
    assert chief["shutdown_ps"] and chief["shutdown_broker"] and chief["checkpoint_dir"] == "/data/ckpt"


def test_every_training_task_uses_what_the_data_service_prepares(project):
    """The data spec's train split, prepared once: the reader streams it (never the test rows the chief
    scores), the ps shards and the workers hold the model fitted to it."""
    data = parse_zmqflow(project.services["data"].command)
    assert project.services["data"].command[1:3] == ["data", "prepare"]   # after the entrypoint
    assert (data["data_spec"], data["model_spec"]) == ("mnist", "mlp")   # ZMQFLOW_DATA, ZMQFLOW_MODEL unset
    prepared = data["out_dir"]
    assert prepared.startswith("/data/")                                  # the shared volume
    reader = parse_zmqflow(project.services["reader"].command)
    assert reader["data_config"] == f"{prepared}/data-config.json" and not reader["preset"]
    for name in ("ps0", "ps1", "worker0", "worker1"):
        assert parse_zmqflow(project.services[name].command)["model_spec"] == f"{prepared}/model.json", name
    for name in ("ps0", "ps1", "reader"):
        assert project.services[name].depends_on["data"] == "service_completed_successfully", name
    for name in ("worker0", "worker1"):
        worker = parse_zmqflow(project.services[name].command)
        assert worker["data_config"] == f"{prepared}/data-config.json" and worker["evaluate"]
        assert worker["examples_per_epoch"] is None                       # the prepared train rows, recorded


def test_data_and_model_variables_are_read():
    from zmqflow.jobs.up.compose import load
    project = load(COMPOSE, env={"ZMQFLOW_DATA": "/user/wine.yaml", "ZMQFLOW_MODEL": "/user/net.py:build",
                                 "ZMQFLOW_NAME": "wine"})
    data = parse_zmqflow(project.services["data"].command)
    assert (data["data_spec"], data["model_spec"]) == ("/user/wine.yaml", "/user/net.py:build")
    assert parse_zmqflow(project.services["serve0"].command)["model_name"] == "wine"


def test_healthcheck_commands_parse(project):
    for name, service in project.services.items():
        if name in ONE_SHOT:
            continue
        test = service.healthcheck.test
        if test[:2] == ["/bin/sh", "-c"]:
            test = shlex.split(test[2].split("|")[0])
        if test[0] == "zmqflow":
            parse_zmqflow(test)
        else:
            assert test[:2] == ["python", "-c"], name
            compile(test[2], name, "exec")


def test_epochs_variable_is_read(tmp_path):
    from zmqflow.jobs.up.compose import load
    project = load(COMPOSE, env={"EPOCHS": "2"})
    assert parse_zmqflow(project.services["reader"].command)["num_epochs"] == 2


def test_compose_v2_override_only_shortens_the_start_of_awaited_healthchecks(project):
    """deploy/compose-v2.yml holds the one v2-only key; the main file stays valid for docker-compose 1.29."""
    import os
    from tests.deploy.conftest import ROOT
    with open(os.path.join(ROOT, "deploy", "compose-v2.yml")) as f:
        override = yaml.safe_load(f)
    awaited = {dep for s in project.services.values() for dep, c in s.depends_on.items() if c == "service_healthy"}
    assert set(override["services"]) == awaited | {"aggregator"}   # and what users wait for before load
    for name, spec in override["services"].items():
        assert spec == {"healthcheck": {"start_interval": "1s"}}, name
        assert project.services[name].healthcheck is not None, name
    for name, spec in project.raw["services"].items():
        assert "start_interval" not in (spec.get("healthcheck") or {}), name
