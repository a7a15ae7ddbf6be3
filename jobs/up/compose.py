"""A docker-compose file read into plain service descriptions, checked before anything starts.

Only what `zmqflow up` needs is modelled: image/build, command/entrypoint,
environment (a map or a list, bare names passed through), healthcheck,
depends_on (with its conditions), profiles, published ports, volumes; `x-`
blocks and YAML anchors are resolved by the YAML loader, variables by
interpolate.py from the environment and the `.env` file next to the compose
file, as Compose does.

The image's entrypoint: a service built here (`build:`) or running an image
named `zmqflow` runs `zmqflow COMMAND...` (the Dockerfile's ENTRYPOINT); any
other image needs its `entrypoint:` spelled out, since `zmqflow up` runs
commands, not images.
"""

import os
import re
import shlex
from dataclasses import dataclass, field

from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.common.spec_files import read_spec_file
from zmqflow.jobs.up.interpolate import InterpolationError, interpolate_tree, read_env_file

CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
IMAGE_ENTRYPOINT = ["zmqflow"]   # the Dockerfile's ENTRYPOINT
IMAGE_NAME = "zmqflow"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class ComposeError(ValueError):
    """The compose file cannot be run: the message names the service and the field."""


@dataclass
class Healthcheck:
    test: list            # argv; a CMD-SHELL test is ["/bin/sh", "-c", script]
    interval: float = 30.0
    timeout: float = 30.0
    retries: int = 3
    start_period: float = 0.0
    start_interval: float = 5.0


@dataclass(frozen=True)
class RestartPolicy:
    """Compose's `restart:` ("no", always, on-failure[:N], unless-stopped): whether an exit with `code` after
    `restarts` restarts so far starts the service again. `down`/Ctrl-C is the stop that `unless-stopped`
    waits for, so under `zmqflow up` it restarts as `always` does."""
    name: str = "no"
    max_retries: int | None = None      # on-failure:N

    def restarts_after(self, code, restarts):
        if self.name in ("always", "unless-stopped"):
            return True
        if self.name == "on-failure":
            return code != 0 and (self.max_retries is None or restarts < self.max_retries)
        return False

    def __str__(self):
        return self.name + (f":{self.max_retries}" if self.max_retries is not None else "")


RESTART_POLICIES = ("no", "always", "on-failure", "unless-stopped")


def restart_policy(value, where):
    """`restart:` as Compose reads it; ComposeError naming the service for anything else."""
    if value is None or value is False:   # YAML's bare `no` is false: Compose reads it as "no" too
        return RestartPolicy()
    name, sep, retries = str(value).partition(":")
    if name not in RESTART_POLICIES or (sep and (name != "on-failure" or not retries.isdigit())):
        raise ComposeError(f"{where} restart: {value!r} is not a restart policy (one of \"no\", always, "
                           "on-failure, on-failure:N, unless-stopped)")
    return RestartPolicy(name, int(retries) if sep else None)


@dataclass
class Volume:
    source: str           # a named volume, or a host path for a bind mount
    target: str           # the path inside the container
    bind: bool = False


@dataclass
class ComposeService:
    name: str
    command: list                                    # the argv run locally: entrypoint + command
    environment: dict = field(default_factory=dict)  # bare names already resolved (or left out)
    healthcheck: Healthcheck | None = None
    depends_on: dict = field(default_factory=dict)   # name -> condition
    volumes: list = field(default_factory=list)
    expose: list = field(default_factory=list)       # container ports, ints
    ports: list = field(default_factory=list)        # published (host ip, host port, container port)
    profiles: list = field(default_factory=list)
    image: str | None = None
    restart: RestartPolicy = field(default_factory=RestartPolicy)   # "no" unless the file says


@dataclass
class ComposeProject:
    path: str
    services: dict            # name -> ComposeService, in file order
    volumes: list             # named volumes
    raw: dict                 # the interpolated document (tests check it against other files)
    env: dict = field(default_factory=dict)   # the variables it was read with (.env, then the environment)

    def active(self, profiles=(), named=()):
        """Names of the services `up` starts: those without profiles, those of an enabled profile,
        and the ones named on the command line (as Compose does)."""
        enabled = set(profiles)
        return [name for name, service in self.services.items()
                if not service.profiles or enabled & set(service.profiles) or name in named]


def duration(value, where):
    """Compose durations: '1m30s', '500ms', '2s', or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ComposeError(f"{where}: {value!r} is not a duration (e.g. 2s, 500ms, 1m30s)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def load(path, env=None, env_file=None):
    """The project in `path`; variables from `env` (default: the environment) over those of
    `env_file` (default: `.env` next to the compose file, when it exists)."""
    try:
        doc = read_spec_file(path, "compose file")
    except (InvalidArgumentError, NotFoundError) as exc:
        raise ComposeError(str(exc)) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict) or not doc["services"]:
        raise ComposeError(f"compose file {path} has no 'services' mapping")
    base = os.path.dirname(os.path.abspath(path))
    try:
        variables = read_env_file(env_file or os.path.join(base, ".env"))
        variables.update(os.environ if env is None else env)
        doc = interpolate_tree(doc, variables)
    except InterpolationError as exc:
        raise ComposeError(str(exc)) from None
    services = {name: _service(name, spec, base, variables) for name, spec in doc["services"].items()}
    for service in services.values():
        for dep in service.depends_on:
            if dep not in services:
                raise ComposeError(f"service {service.name} depends_on: {dep!r} is not a service "
                                   f"(services: {', '.join(services)})")
    start_order(services)   # no depends_on cycle
    _check_published_ports(services)
    volumes = list(doc.get("volumes") or {})
    for service in services.values():
        for volume in service.volumes:
            if not volume.bind and volume.source not in volumes:
                raise ComposeError(f"service {service.name} volumes: named volume {volume.source!r} is not "
                                   "declared under the top-level 'volumes' key")
    return ComposeProject(os.path.abspath(path), services, volumes, doc, variables)


def _argv(value, where):
    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as exc:
            raise ComposeError(f"{where}: {exc}") from None
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ComposeError(f"{where}: expected a string or a list of strings, not {value!r}")


def _service(name, spec, base, variables):
    where = f"service {name}"
    if not isinstance(spec, dict):
        raise ComposeError(f"{where}: expected a mapping, not {spec!r}")
    image, build = spec.get("image"), spec.get("build")
    if not image and not build:
        raise ComposeError(f"{where}: no image and no build (set image: or build:)")
    command = _argv(spec.get("command"), f"{where} command")
    if "entrypoint" in spec:
        command = _argv(spec["entrypoint"], f"{where} entrypoint") + command
    elif build or _image_name(image) == IMAGE_NAME:
        command = IMAGE_ENTRYPOINT + (command if command else ["--help"])
    if not command:
        raise ComposeError(f"{where} has no command (zmqflow up runs the command, not the image)")
    profiles = spec.get("profiles") or []
    if not isinstance(profiles, list) or not all(isinstance(p, str) for p in profiles):
        raise ComposeError(f"{where} profiles: expected a list of names, not {profiles!r}")
    return ComposeService(name, command, _environment(spec.get("environment"), where, variables),
                          _healthcheck(spec.get("healthcheck"), where), _depends_on(spec.get("depends_on"), where),
                          [_volume(v, base, where) for v in spec.get("volumes") or []],
                          [_port_number(str(p).split("/")[0], f"{where} expose") for p in spec.get("expose") or []],
                          [_published(p, where) for p in spec.get("ports") or []], profiles, image,
                          restart_policy(spec.get("restart"), where))


def _image_name(image):
    """`registry:5000/team/zmqflow:1.2` -> `zmqflow`."""
    last = str(image or "").split("@")[0].rsplit("/", 1)[-1]
    return last.split(":")[0]


def _environment(env, where, variables):
    """NAME=value pairs; a bare NAME (list) or NAME: with no value (map) takes the variable's value
    from the environment or .env, and is left out when it has none, as Compose does."""
    if env is None:
        return {}
    if isinstance(env, list):
        items = {}
        for item in env:
            name, sep, value = str(item).partition("=")
            items[name] = value if sep else None
    elif isinstance(env, dict):
        items = {}
        for k, v in env.items():
            if isinstance(v, bool):
                raise ComposeError(f"{where} environment {k}: {str(v).lower()} is a YAML boolean; quote it "
                                   f"(\"{str(v).lower()}\"): docker-compose 1.29 rejects booleans there")
            if isinstance(v, (dict, list)):
                raise ComposeError(f"{where} environment {k}: expected a string or a number, not {v!r}")
            items[str(k)] = None if v is None else str(v)
    else:
        raise ComposeError(f"{where} environment: expected a mapping or a list of NAME=value, not {env!r}")
    resolved = {}
    for name, value in items.items():
        if value is None:
            value = variables.get(name)
        if value is not None:
            resolved[name] = value
    return resolved


def _port_number(text, where):
    try:
        port = int(text)
    except ValueError:
        raise ComposeError(f"{where}: {text!r} is not a port number") from None
    if not 0 < port <= 65535:
        raise ComposeError(f"{where}: port {port} is out of range (1-65535)")
    return port


def _published(port, where):
    """A `ports:` entry, short (`[IP:]HOST:CONTAINER[/proto]`) or long syntax -> (ip, host port, container port)."""
    where = f"{where} ports"
    if isinstance(port, dict):
        ip, host, target = port.get("host_ip", ""), port.get("published"), port.get("target")
        if target is None:
            raise ComposeError(f"{where}: {port!r} has no target")
        return (ip, _port_number(str(host), where) if host not in (None, "") else None, _port_number(str(target), where))
    text = str(port).split("/")[0]
    parts = text.rsplit(":", 2)
    if len(parts) == 1:
        return ("", None, _port_number(parts[0], where))
    ip = parts[0] if len(parts) == 3 else ""
    return (ip.strip("[]"), _port_number(parts[-2], where), _port_number(parts[-1], where))


def _check_published_ports(services):
    seen = {}
    for service in services.values():
        for ip, host, _ in service.ports:
            if host is None:
                continue
            for other_ip, other in seen.get(host, []):
                if ip == other_ip or "" in (ip, other_ip) or "0.0.0.0" in (ip, other_ip):
                    raise ComposeError(f"service {service.name} ports: host port {host} is also published by "
                                       f"service {other}")
            seen.setdefault(host, []).append((ip, service.name))


def _healthcheck(check, where):
    if not check or check.get("disable"):
        return None
    test = check.get("test")
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if not isinstance(test, list) or not test or test[0] not in ("CMD", "CMD-SHELL", "NONE"):
        raise ComposeError(f"{where} healthcheck test must be a string or a list starting with CMD or CMD-SHELL")
    if test[0] == "NONE":
        return None
    if len(test) < 2:
        raise ComposeError(f"{where} healthcheck test has no command after {test[0]}")
    argv = ["/bin/sh", "-c", " ".join(map(str, test[1:]))] if test[0] == "CMD-SHELL" else [str(t) for t in test[1:]]
    times = {key: duration(check[key], f"{where} healthcheck {key}")
             for key in ("interval", "timeout", "start_period", "start_interval") if key in check}
    return Healthcheck(argv, retries=int(check.get("retries", 3)), **times)


def _depends_on(deps, where):
    if deps is None:
        return {}
    if isinstance(deps, list):
        return {str(d): "service_started" for d in deps}
    if not isinstance(deps, dict):
        raise ComposeError(f"{where} depends_on: expected a list or a mapping")
    result = {}
    for dep, options in deps.items():
        if options is not None and not isinstance(options, dict):
            raise ComposeError(f"{where} depends_on {dep}: expected a mapping with a condition, not {options!r}")
        condition = (options or {}).get("condition", "service_started")
        if condition not in CONDITIONS:
            raise ComposeError(f"{where} depends_on {dep}: condition {condition!r} is not one of {', '.join(CONDITIONS)}")
        result[str(dep)] = condition
    return result


def _volume(volume, base, where):
    if isinstance(volume, dict):
        source, target = volume.get("source", ""), volume.get("target", "")
        bind = volume.get("type") == "bind"
    else:
        source, _, rest = str(volume).partition(":")
        target = rest.split(":")[0]
        bind = source.startswith((".", "/", "~"))
    if not source or not target:
        raise ComposeError(f"{where} volume {volume!r}: expected SOURCE:TARGET")
    if bind:
        source = os.path.normpath(os.path.join(base, os.path.expanduser(source)))
    return Volume(source, target.rstrip("/") or "/", bind)


def start_order(services):
    """Names in an order where every service comes after what it depends on (file order otherwise);
    ComposeError when depends_on makes a cycle."""
    order, state = [], {}

    def visit(name, path):
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise ComposeError(f"service {path[-1]} depends_on: a cycle: " + " -> ".join(path + [name]))
        state[name] = "visiting"
        for dep in services[name].depends_on:
            visit(dep, path + [name])
        state[name] = "done"
        order.append(name)
    for name in services:
        visit(name, [])
    return order


def resolved_config(project, names):
    """The chosen services as `docker compose config` resolves them, in the fields `zmqflow up` uses
    (variables, .env, pass-through environment, depends_on conditions, profiles, published ports),
    as plain data: `zmqflow up --config` prints it, a test compares it with Compose's own."""
    services = {}
    for name in names:
        spec, service = project.raw["services"][name], project.services[name]
        entry = {"image": service.image, "command": _argv(spec.get("command"), name) or None,
                 "entrypoint": _argv(spec.get("entrypoint"), name) if "entrypoint" in spec else None,
                 "environment": dict(service.environment),
                 "depends_on": {dep: {"condition": c} for dep, c in service.depends_on.items()},
                 "profiles": list(service.profiles),
                 "ports": [f"{ip + ':' if ip else ''}{host}:{target}" if host else str(target)
                           for ip, host, target in service.ports],
                 "volumes": [f"{v.source}:{v.target}" for v in service.volumes],
                 "restart": None if service.restart.name == "no" else str(service.restart)}
        if service.healthcheck is not None:
            entry["healthcheck"] = {"test": list(spec["healthcheck"]["test"]) if isinstance(
                spec["healthcheck"]["test"], list) else ["CMD-SHELL", spec["healthcheck"]["test"]]}
        services[name] = {k: v for k, v in entry.items() if v not in (None, [], {})}
    return {"services": services, "volumes": list(project.volumes)}
