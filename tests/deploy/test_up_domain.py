"""zmqflow up without processes: interpolation, compose checks, hosts/ports/volumes onto this machine."""

import json

import pytest

from zmqflow.jobs.up.topology import find_chief, select
from zmqflow.jobs.up.compose import ComposeError, duration, load
from zmqflow.jobs.up.interpolate import InterpolationError, interpolate
from zmqflow.jobs.up.localize import Localizer, share_cores

pytestmark = pytest.mark.unit


def test_interpolation_like_compose():
    env = {"A": "1", "EMPTY": ""}
    assert interpolate("${EPOCHS:-5} ${A:-9} $A ${A} $$A", env) == "5 1 1 1 $A"
    assert interpolate("${EMPTY:-d}|${EMPTY-d}|${A:+yes}|${B:+yes}", env) == "d||yes|"
    with pytest.raises(InterpolationError, match="NEEDED.*set it"):
        interpolate("${NEEDED:?set it}", env)
    with pytest.raises(InterpolationError, match="invalid interpolation"):
        interpolate("${1bad}", env)


def test_durations():
    assert duration("1m30s", "x") == 90 and duration("500ms", "x") == 0.5 and duration(3, "x") == 3
    with pytest.raises(ComposeError, match="not a duration"):
        duration("soon", "x")


def write(tmp_path, text):
    path = tmp_path / "compose.yml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, message", [
    ("services:\n  a: {image: x}\n", "service a has no command"),
    ("services:\n  a: {command: x}\n", "service a: no image and no build"),
    ("services:\n  a: {image: x, command: x, depends_on: {b: {condition: service_healthy}}}\n",
     "service a depends_on: 'b' is not a service"),
    ("services:\n  a: {image: x, command: x, depends_on: {a: {condition: service_running}}}\n",
     "service a depends_on a: condition 'service_running'"),
    ("services:\n  a: {image: x, command: x, depends_on: [b]}\n  b: {image: x, command: x, depends_on: [a]}\n",
     "service b depends_on: a cycle: a -> b -> a"),
    ("services:\n  a: {image: x, command: x, healthcheck: {test: [PING]}}\n", "service a healthcheck test.*CMD or CMD-SHELL"),
    ("version: '3'\n", "no 'services'"),
    ("services:\n  a: {image: x, command: '${X:?X is required}'}\n", "services a command: required variable X.*X is required"),
    ("services:\n  a: {image: x, command: '${X?}'}\n", "required variable X is not set"),
    ("services:\n  a: {image: x, command: 'price $5'}\n", "services a command: invalid interpolation.*\\$\\$"),
    ("services:\n  a: {image: x, command: x, ports: ['127.0.0.1:80:80']}\n  b: {image: x, command: x, ports: ['80:81']}\n",
     "service b ports: host port 80 is also published by service a"),
    ("services:\n  a: {image: x, command: x, ports: ['99999:80']}\n", "service a ports: port 99999 is out of range"),
    ("services:\n  a: {image: x, command: x, volumes: ['nope:/data']}\n",
     "service a volumes: named volume 'nope' is not declared"),
    ("services:\n  a: {image: x, command: x, profiles: debug}\n", "service a profiles: expected a list"),
    ("services:\n  a: {image: x, command: x, environment: {DEBUG: true}}\n", "service a environment DEBUG: true is a YAML boolean"),
])
def test_bad_compose_files_are_named(tmp_path, text, message):
    with pytest.raises(ComposeError, match=message):
        load(write(tmp_path, text), env={})


def test_localize_hosts_ports_tf_config_and_volumes(project, tmp_path):
    localizer = Localizer(project.services, port_offset=1000, workdir=str(tmp_path))
    ps0 = localizer.localize(project.services["ps0"])
    cluster = json.loads(ps0.env["TF_CONFIG"])["cluster"]
    assert cluster["ps"] == ["127.0.0.1:6600", "127.0.0.1:6601"] and cluster["broker"] == ["127.0.0.1:6555"]
    assert ps0.argv[ps0.argv.index("--restore-from") + 1] == str(tmp_path / "zmqflow-data" / "ckpt")
    assert ps0.argv[-2:] == ["--metrics-bind", "127.0.0.1:7600"]   # metrics move with the offset too
    worker1 = localizer.localize(project.services["worker1"])
    assert worker1.env["ZMQFLOW_METRICS_BIND"] == "127.0.0.1:7611"
    assert ps0.health == ["zmqflow", "ping", "--address", "tcp://127.0.0.1:6600"]
    broker = localizer.localize(project.services["broker"])
    assert broker.argv[broker.argv.index("--bind") + 1] == "127.0.0.1:6555"
    aggregator = localizer.localize(project.services["aggregator"])
    assert "tcp://127.0.0.1:6702" in aggregator.argv and not any("serve" in a for a in aggregator.argv)
    gateway = localizer.localize(project.services["gateway"])   # HTTP and gRPC addresses move like the ZeroMQ ones
    assert gateway.argv[2:10] == ["--aggregator", "tcp://127.0.0.1:6800", "--bind", "127.0.0.1:9000",
                                  "--grpc-bind", "127.0.0.1:9001", "--metrics-bind", "127.0.0.1:10000"]
    assert gateway.ports == [9000, 9001, 10000]   # what `zmqflow ps` shows
    assert gateway.health[-1] == "http://127.0.0.1:9000/v2/health/ready"
    # only the topology's hosts move: a port on another host, or a path like /database, stays
    assert localizer.address("tcp://example.org:5600 ps0:5600x tcp://*:5601") == \
        "tcp://example.org:5600 127.0.0.1:6600x tcp://127.0.0.1:6601"
    assert localizer.text("/database /data", [("/data", "/local")]) == "/database /local"
    with pytest.raises(ValueError, match="out of range"):
        Localizer(project.services, port_offset=60_000).address("ps0:5600")


def test_compute_services_share_the_cores_unless_they_set_their_own_threads(project, tmp_path):
    localizer = Localizer(project.services, workdir=str(tmp_path))
    services = {name: localizer.localize(service) for name, service in project.services.items()}
    services["serve2"].env["OMP_NUM_THREADS"] = "3"                  # the user's own choice is kept
    share_cores(list(services.values()), cores=8)
    compute = [n for n in services if n.startswith(("worker", "serve"))]
    assert sorted(compute) == ["serve0", "serve1", "serve2", "worker0", "worker1"]
    for name in compute:
        expected = {"OMP_NUM_THREADS": "3"} if name == "serve2" else {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                                                                      "MKL_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
        assert {k: v for k, v in services[name].env.items() if k.endswith("_NUM_THREADS")} == expected, name
    assert not any(k.endswith("_NUM_THREADS") for k in services["broker"].env)
    wide = share_cores([localizer.localize(project.services["worker0"])], cores=16)[0]
    assert wide.env["OPENBLAS_NUM_THREADS"] == "16"                   # alone, it has the machine


def test_selection_adds_dependencies_and_finds_the_chief(project):
    # data: the ps shards' model; keys: everyone's CURVE keys
    assert select(project, ["worker1"]) == ["keys", "broker", "data", "ps0", "ps1", "worker1"]
    assert select(project, ["worker1"], with_deps=False) == ["worker1"]
    assert select(project, [])[-2:] == ["aggregator", "gateway"]
    with pytest.raises(ComposeError, match="no such service: nope"):
        select(project, ["nope"])
    localizer = Localizer(project.services)
    services = [localizer.localize(project.services[n]) for n in select(project, [])]
    assert find_chief(services) == "worker0"
