"""zmqflow up reads a compose file as Compose does: variables, .env, environment, profiles, entrypoint."""

import json
import shutil
import subprocess

import pytest
import yaml

from zmqflow.jobs.up.compose import ComposeError, load, resolved_config
from zmqflow.jobs.up.interpolate import InterpolationError, interpolate, read_env_file
from zmqflow.jobs.up.localize import Localizer
from zmqflow.jobs.up.topology import check_local_ports, find_chief, select, waits_for_completion

pytestmark = pytest.mark.unit


def test_nested_defaults_required_and_escapes():
    env = {"A": "a", "B": "b", "EMPTY": ""}
    assert interpolate("${NOPE:-${B}}|${NOPE:-${NADA:-deep}}|${A:-${B}}", env) == "b|deep|a"
    assert interpolate("${EMPTY-d}|${EMPTY:-d}|${NOPE-d}|${A+set}|${NOPE+set}", env) == "|d|d|set|"
    assert interpolate("$$A $${A} cost: $$5 ${A}$B", env) == "$A ${A} cost: $5 ab"
    assert interpolate("${EMPTY?}", env) == ""          # '?' only wants it set; ':?' wants it non-empty
    with pytest.raises(InterpolationError, match="required variable EMPTY is not set: give one"):
        interpolate("${EMPTY:?give one}", env)
    with pytest.raises(InterpolationError, match="required variable NOPE is not set: needs b"):
        interpolate("${NOPE?needs ${B}}", env)
    with pytest.raises(InterpolationError, match="no closing brace"):
        interpolate("${A:-${B}", env)
    with pytest.raises(InterpolationError, match="invalid interpolation"):
        interpolate("${A:x}", env)


def test_env_file_syntax(tmp_path):
    path = tmp_path / ".env"
    path.write_text("# comment\n\nA=1\nexport B = two words \nC='quoted # not a comment'\nD=\"x\"\nE=v # note\n")
    assert read_env_file(str(path)) == {"A": "1", "B": "two words", "C": "quoted # not a comment", "D": "x", "E": "v"}
    assert read_env_file(str(tmp_path / "missing")) == {}
    path.write_text("A=1\nnot a line\n")
    with pytest.raises(InterpolationError, match="line 2: expected NAME=value"):
        read_env_file(str(path))


COMPOSE = """
x-base: &base
  image: zmqflow:${TAG:-latest}
services:
  train:
    <<: *base
    command: ["worker", "--epochs", "${EPOCHS:-5}", "--dir", "${DIR:-${HOME_DIR:-/data}/ckpt}"]
    environment: [ "FROM_LIST=1", PASSED, NOT_SET_ANYWHERE ]
    expose: ["5600"]
  serve:
    image: registry.example:5000/team/zmqflow:1.2
    command: serve --checkpoint /data/ckpt
    environment: {FLAG: "true", NUM: 3, PASSED: , EMPTY: ""}
    depends_on: {train: {condition: service_completed_successfully}}
    ports: ["127.0.0.1:${PORT:-5800}:5800"]
    expose: ["5700"]
    restart: unless-stopped
  other:
    image: python:3.11-slim
    entrypoint: ["python", "-c"]
    command: ["print(1)"]
    expose: ["5700"]
    profiles: [debug]
    restart: on-failure:3
  load:
    build: .
    profiles: [loadtest]
    depends_on: [serve]
"""


@pytest.fixture
def compose(tmp_path):
    path = tmp_path / "docker-compose.yml"
    path.write_text(COMPOSE)
    (tmp_path / ".env").write_text("EPOCHS=7\nPASSED=from-dotenv\nPORT=5900\nHOME_DIR=/home\n")
    return path


def test_dot_env_next_to_the_file_and_environment_over_it(compose, tmp_path):
    project = load(str(compose), env={"PORT": "6000"})
    train = project.services["train"]
    assert train.command == ["zmqflow", "worker", "--epochs", "7", "--dir", "/home/ckpt"]
    assert project.services["serve"].ports == [("127.0.0.1", 6000, 5800)]   # the environment wins over .env
    other = tmp_path / "other.env"
    other.write_text("EPOCHS=9\n")
    assert load(str(compose), env={}, env_file=str(other)).services["train"].command[3] == "9"


def test_environment_list_map_and_pass_through(compose):
    project = load(str(compose), env={"PASSED": "from-shell"})
    assert project.services["train"].environment == {"FROM_LIST": "1", "PASSED": "from-shell"}   # unset: left out
    assert project.services["serve"].environment == {"FLAG": "true", "NUM": "3", "PASSED": "from-shell", "EMPTY": ""}
    assert load(str(compose), env={}).services["train"].environment["PASSED"] == "from-dotenv"


def test_image_entrypoint_is_zmqflow_for_its_own_images_only(compose):
    services = load(str(compose), env={}).services
    assert services["serve"].command == ["zmqflow", "serve", "--checkpoint", "/data/ckpt"]   # an image named zmqflow
    assert services["load"].command == ["zmqflow", "--help"]                               # built here: the CMD
    assert services["other"].command == ["python", "-c", "print(1)"]                       # its own entrypoint


def test_restart_policies_as_compose_reads_them(compose, tmp_path):
    services = load(str(compose), env={}).services
    assert str(services["serve"].restart) == "unless-stopped" and str(services["train"].restart) == "no"
    other = services["other"].restart
    assert (other.name, other.max_retries) == ("on-failure", 3)
    assert other.restarts_after(1, 2) and not other.restarts_after(1, 3) and not other.restarts_after(0, 0)
    assert services["serve"].restart.restarts_after(0, 99) and not services["train"].restart.restarts_after(1, 0)
    for bad in ("sometimes", "always:3", "on-failure:x"):
        path = tmp_path / "bad.yml"
        path.write_text(f"services:\n  s:\n    image: zmqflow\n    restart: {bad}\n")
        with pytest.raises(ComposeError, match=f"service s restart: '{bad}' is not a restart policy"):
            load(str(path), env={})


def test_profiles_like_compose(compose):
    project = load(str(compose), env={})
    assert select(project, []) == ["train", "serve"]
    assert select(project, [], profiles=["loadtest"]) == ["train", "serve", "load"]
    assert select(project, ["load"]) == ["train", "serve", "load"]     # naming a service runs it
    assert select(project, ["other"]) == ["other"]


def test_one_host_port_clash_is_named(compose):
    project = load(str(compose), env={})
    check_local_ports(project, ["train", "serve"])
    with pytest.raises(ComposeError, match="service other expose: port 5700 is also exposed by service serve"):
        check_local_ports(project, ["train", "serve", "other"])


def test_the_chief_ends_the_run_unless_a_service_waits_for_its_completion(project):
    localizer = Localizer(project.services)
    everything = [localizer.localize(project.services[n]) for n in select(project, [])]
    training = [localizer.localize(project.services[n]) for n in select(project, ["worker0", "worker1", "reader"])]
    assert find_chief(everything) == find_chief(training) == "worker0"
    assert waits_for_completion(everything, "worker0")          # the model servers start on its final checkpoint
    assert not waits_for_completion(training, "worker0")


def test_shipped_file_keeps_serving_off_worker_health(project):
    for name in ("serve0", "serve1", "serve2"):
        assert project.services[name].depends_on == {"keys": "service_completed_successfully",
                                                     "worker0": "service_completed_successfully"}
    assert set(project.services["aggregator"].depends_on) == {"keys", "serve0", "serve1", "serve2"}
    assert project.services["loadtest"].profiles == ["loadtest"]
    assert "loadtest" not in select(project, [])
    for service in project.services.values():
        assert all(ip == "127.0.0.1" for ip, _, _ in service.ports), service.name
        for dep, condition in service.depends_on.items():
            if dep.startswith("worker"):
                assert condition == "service_completed_successfully", service.name


COMPOSE_BINARIES = [b for b in (["docker", "compose"], ["docker-compose"])
                    if shutil.which(b[0]) and subprocess.run(b + ["version"], capture_output=True).returncode == 0]


def compose_v1(binary):
    done = subprocess.run(binary + ["version", "--short"], capture_output=True, text=True)
    return done.stdout.strip().startswith("1.")


def docker_compose_config(compose, env):
    """`docker compose config` (or docker-compose's) of the same file, as plain data."""
    binary = COMPOSE_BINARIES[0]
    if compose_v1(binary):   # docker-compose 1.x does not nest defaults (Compose v2 does, and zmqflow up)
        compose.write_text(COMPOSE.replace("${DIR:-${HOME_DIR:-/data}/ckpt}", "${DIR:-/data/ckpt}"))
    done = subprocess.run(binary + ["-f", str(compose), "--profile", "loadtest", "--profile", "debug", "config"],
                          cwd=compose.parent, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def normalized(service):
    """The fields zmqflow up resolves, spelled one way (Compose v1 and v2 print some differently)."""
    ports = []
    for p in service.get("ports") or []:
        if isinstance(p, dict):
            p = ":".join(x for x in (p.get("host_ip"), str(p.get("published") or ""), str(p["target"])) if x)
        ports.append(str(p).split("/")[0])
    command = service.get("command")
    return {"image": service.get("image"),
            "command": command.split() if isinstance(command, str) else command,
            "environment": {k: str(v) for k, v in (service.get("environment") or {}).items() if v is not None},
            "depends_on": {k: v.get("condition", "service_started") if isinstance(v, dict) else "service_started"
                           for k, v in (service.get("depends_on") or {}).items()},
            "profiles": service.get("profiles") or [],
            "ports": ports, "restart": service.get("restart") or "no"}


@pytest.mark.skipif(not COMPOSE_BINARIES, reason="neither `docker compose` nor `docker-compose` is installed")
def test_resolved_configuration_equals_docker_compose_config(compose, tmp_path):
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "PASSED": "from-shell", "TAG": "1.0", "DOCKER_HOST": "unix:///nonexistent"}
    theirs = docker_compose_config(compose, env)["services"]
    project = load(str(compose), env=env)
    ours = json.loads(json.dumps(resolved_config(project, list(project.services))))["services"]
    assert set(ours) == set(theirs)
    for name in ours:
        mine = normalized(ours[name])
        if "build" in theirs[name] and "image" not in ours[name]:
            theirs[name].pop("image", None)   # Compose names an unnamed build's image after the project
        assert mine == normalized(theirs[name]), name


@pytest.mark.skipif(not COMPOSE_BINARIES, reason="neither `docker compose` nor `docker-compose` is installed")
def test_shipped_file_resolves_as_docker_compose_does(tmp_path):
    from tests.deploy.conftest import COMPOSE as SHIPPED
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "EPOCHS": "2", "DOCKER_HOST": "unix:///nonexistent"}
    done = subprocess.run(COMPOSE_BINARIES[0] + ["-f", SHIPPED, "--profile", "loadtest", "config"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    theirs = yaml.safe_load(done.stdout)["services"]
    project = load(SHIPPED, env=env)
    ours = resolved_config(project, list(project.services))["services"]
    assert set(ours) == set(theirs)
    for name in ours:
        assert normalized(ours[name]) == normalized(theirs[name]), name
    assert "2" in ours["reader"]["command"]
