"""docker-compose.yml: every service runnable as written, checked against the real CLIs."""

import shlex

import click
import pytest
import yaml

from zmqflow.common.processes import metrics
from zmqflow.common.cluster.spec import ClusterSpec
from zmqflow.common.processes.service_cli import METRICS_BIND_ENV
from zmqflow.cli.main import main
from tests.deploy.conftest import COMPOSE, compose_ports

pytestmark = pytest.mark.unit

TOPOLOGY = {"keys", "data", "broker", "ps0", "ps1", "reader", "worker0", "worker1", "serve0", "serve1", "serve2", "aggregator",
            "gateway"}
PROFILED = {"loadtest", "loadtest-http", "dashboard"}   # run only with their profile


def parse_zmqflow(argv):
    """Parse `zmqflow SUB ... ARGS` with the real click commands (options, types, choices)."""
    assert argv[0] == "zmqflow", argv
    command, args, ctx = main, list(argv[1:]), None
    while isinstance(command, click.Group):
        name = args.pop(0)
        sub = command.get_command(click.Context(command), name)
        assert sub is not None, f"`zmqflow {name}` (in {' '.join(argv)}) is not a registered command"
        command = sub
    requested = dict(metrics._requested)   # the --metrics-bind callback records it for this process
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
        if name != "keys":
            assert spec["volumes"] == ["zmqflow-data:/data", "./deploy/user:/user:ro", "zmqflow-keys:/keys:ro"], name
        assert spec["image"] == "zmqflow:latest"
    assert project.volumes == ["zmqflow-data", "zmqflow-keys"]


def test_every_service_runs_with_curve_keys_made_once_by_the_keys_service(project):
    """CURVE by default: the one-shot `keys` service writes the volume (keeping keys already there), every
    other service waits for it and reads the keys read-only; ZMQFLOW_COMPOSE_CURVE_DIR= opts out."""
    from zmqflow.jobs.up.compose import load
    keys = project.services["keys"]
    assert parse_zmqflow(keys.command)["keep"] and keys.command[1:4] == ["keys", "generate", "/keys"]
    assert project.raw["services"]["keys"]["volumes"] == ["zmqflow-keys:/keys"]   # the only writer
    for name, service in project.services.items():
        assert service.environment["ZMQFLOW_CURVE_DIR"] == "/keys", name
        if name != "keys":
            assert service.depends_on["keys"] == "service_completed_successfully", name
    plain = load(COMPOSE, env={"ZMQFLOW_COMPOSE_CURVE_DIR": "", "ZMQFLOW_ADMIN_TOKEN": "t0ken"})
    for name, service in plain.services.items():
        assert service.environment["ZMQFLOW_CURVE_DIR"] == "" and service.environment["ZMQFLOW_ADMIN_TOKEN"] == "t0ken"


ONE_SHOT = {"keys", "data", "loadtest", "loadtest-http"}   # exit 0 when done, no healthcheck
COMPLETES = {"keys", "data", "worker0"}    # dependents wait for service_completed_successfully


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
    assert project.services["broker"].depends_on == {"keys": "service_completed_successfully"}
    assert project.services["ps0"].depends_on == {"keys": "service_completed_successfully",
                                                  "data": "service_completed_successfully"}   # its model.json
    assert set(project.services["worker0"].depends_on) == {"keys", "broker", "ps0", "ps1"}


def test_ports_unique_and_each_service_binds_its_own(project):
    ports = compose_ports(project)
    assert len(ports) == len(set(ports))
    assert ports == [5555, 5600, 5601, 5700, 5701, 5702, 5800, 6555, 6600, 6601, 6610, 6611, 6620, 6700, 6701, 6702,
                     6800, 8000, 8001, 8088, 9000]
    for name in ("broker", "serve0", "serve1", "serve2", "aggregator"):
        service = project.services[name]
        bind = service.command[service.command.index("--bind") + 1]
        assert bind == f"0.0.0.0:{service.expose[0]}"   # [HOST:]PORT, as every --bind (V5, docs/cli.md)
        assert f"tcp://127.0.0.1:{service.expose[0]}" in service.healthcheck.test


def metrics_bind(service):
    """The service's --metrics-bind, from its command or its ZMQFLOW_METRICS_BIND."""
    if "--metrics-bind" in service.command:
        return service.command[service.command.index("--metrics-bind") + 1]
    return service.environment.get(METRICS_BIND_ENV)


def test_every_long_running_service_exposes_prometheus_metrics_on_its_port_plus_1000(project):
    for name, service in project.services.items():
        if name in ONE_SHOT or name == "dashboard":    # the dashboard serves a web page, no metrics of its own
            continue
        port = int(service.expose[-1])
        assert metrics_bind(service) == f"0.0.0.0:{port}", name     # every interface of its container
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
        assert "examples_per_epoch" not in worker      # no flag (launchers' --config only): the prepared rows, recorded


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
    assert set(override["services"]) == awaited | {"gateway"}   # and what users wait for before load
    for name, spec in override["services"].items():
        assert spec == {"healthcheck": {"start_interval": "1s"}}, name
        assert project.services[name].healthcheck is not None, name
    for name, spec in project.raw["services"].items():
        assert "start_interval" not in (spec.get("healthcheck") or {}), name


def test_the_keys_service_makes_keys_once_and_keeps_them(project, tmp_path):
    """Its command run twice on one volume: the second run keeps (and checks) the first run's keys."""
    from click.testing import CliRunner
    argv = [str(tmp_path / "keys") if a == "/keys" else a for a in project.services["keys"].command[1:]]
    first = CliRunner().invoke(main, argv)
    assert first.exit_code == 0, first.output
    server = (tmp_path / "keys" / "server.key_secret").read_bytes()
    again = CliRunner().invoke(main, argv)
    assert again.exit_code == 0 and "keeping the keys" in again.output, again.output
    assert (tmp_path / "keys" / "server.key_secret").read_bytes() == server
    (tmp_path / "keys" / "client.key_secret").write_text("damaged")
    broken = CliRunner().invoke(main, argv)
    assert broken.exit_code == 1 and "client.key_secret is not a ZeroMQ certificate" in broken.output, broken.output


def test_the_dashboard_profile_shows_every_task_on_the_hosts_loopback(project):
    dashboard = project.services["dashboard"]
    params = parse_zmqflow(dashboard.command)
    assert params["web"] and params["web_port"].socket_address() == ("0.0.0.0", 8088) and dashboard.ports == [("127.0.0.1", 8088, 8088)]
    shown = {address.split(":")[0] for option in ("broker", "ps", "serve", "aggregator", "worker_metrics")
             for item in params[option] for address in item.split(",")}
    assert shown == TOPOLOGY - {"keys", "data", "reader", "gateway"}   # the reader serves no RPC; the gateway's
    # health is the aggregator's
    assert project.services["dashboard"].profiles == ["dashboard"]


def test_the_gateway_fronts_the_aggregator_on_the_hosts_loopback(project):
    """HTTP on 127.0.0.1:8000 of the host (ZMQFLOW_GATEWAY_PORT) and gRPC on 8001 (ZMQFLOW_GATEWAY_GRPC_PORT), ready
    once the aggregator is healthy, checked at its own readiness route; the load-test profile drives it over HTTP,
    as `loadtest` drives the aggregator."""
    from zmqflow.jobs.up.compose import load
    gateway = project.services["gateway"]
    options = parse_zmqflow(gateway.command)
    assert (options["aggregator"], options["bind"].socket_address(), options["server"]) == (
        "tcp://aggregator:5800", ("0.0.0.0", 8000), None)
    assert options["grpc_bind"].socket_address() == ("0.0.0.0", 8001)
    assert gateway.ports == [("127.0.0.1", 8000, 8000), ("127.0.0.1", 8001, 8001)] and gateway.expose == [8000, 8001,
                                                                                                          9000]
    assert gateway.depends_on == {"keys": "service_completed_successfully", "aggregator": "service_healthy"}
    assert gateway.healthcheck.test == ["zmqflow", "healthcheck", "--http", "http://127.0.0.1:8000/v2/health/ready"]
    assert load(COMPOSE, env={"ZMQFLOW_GATEWAY_PORT": "18000", "ZMQFLOW_GATEWAY_GRPC_PORT": "18001"}).services[
        "gateway"].ports == [("127.0.0.1", 18000, 8000), ("127.0.0.1", 18001, 8001)]
    http_load = parse_zmqflow(project.services["loadtest-http"].command)
    assert (http_load["http_url"], http_load["model"], http_load["address"]) == ("http://gateway:8000", "ensemble", None)
    assert http_load["max_failures"] == 0 and http_load["wait_secs"] > 0
    assert project.services["loadtest-http"].depends_on == {"keys": "service_completed_successfully"}


def test_serving_services_restart_unless_stopped_and_training_tasks_run_once(project):
    """A killed model server, aggregator or gateway is started again (docker compose and zmqflow up alike); the
    training tasks and the one-shots end, and stay ended."""
    serving = {"serve0", "serve1", "serve2", "aggregator", "gateway"}
    for name, service in project.services.items():
        assert str(service.restart) == ("unless-stopped" if name in serving else "no"), name
        assert project.raw["services"][name].get("restart") == ("unless-stopped" if name in serving else None), name
