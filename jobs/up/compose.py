"""A docker-compose file read into plain service descriptions, checked before anything starts.

Only what `zmqflow up` needs is modelled: command/entrypoint, environment,
healthcheck, depends_on (with its conditions), volumes; `x-` blocks and YAML
anchors are resolved by the YAML loader and the interpolation by interpolate.py.
"""

import os
import re
import shlex
from dataclasses import dataclass, field

import yaml

from zmqflow.jobs.up.interpolate import InterpolationError, interpolate_tree

CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")
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


@dataclass
class Volume:
    source: str           # a named volume, or a host path for a bind mount
    target: str           # the path inside the container
    bind: bool = False


@dataclass
class ComposeService:
    name: str
    command: list
    environment: dict = field(default_factory=dict)
    healthcheck: Healthcheck | None = None
    depends_on: dict = field(default_factory=dict)   # name -> condition
    volumes: list = field(default_factory=list)
    expose: list = field(default_factory=list)       # container ports, ints


@dataclass
class ComposeProject:
    path: str
    services: dict            # name -> ComposeService, in file order
    volumes: list             # named volumes
    raw: dict                 # the interpolated document (tests check it against other files)


def duration(value, where):
    """Compose durations: '1m30s', '500ms', '2s', or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ComposeError(f"{where}: {value!r} is not a duration (e.g. 2s, 500ms, 1m30s)")
    return sum(float(n) * _UNITS[u] for n, u in parts)


def load(path, env=None):
    """The project in `path`, variables from `env` (default: the environment)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except FileNotFoundError:
        raise ComposeError(f"compose file {path} does not exist") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ComposeError(f"compose file {path} cannot be read: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict) or not doc["services"]:
        raise ComposeError(f"compose file {path} has no 'services' mapping")
    try:
        doc = interpolate_tree(doc, dict(os.environ if env is None else env))
    except InterpolationError as exc:
        raise ComposeError(str(exc)) from None
    base = os.path.dirname(os.path.abspath(path))
    services = {name: _service(name, spec, base) for name, spec in doc["services"].items()}
    for service in services.values():
        for dep in service.depends_on:
            if dep not in services:
                raise ComposeError(f"service {service.name}: depends_on names {dep!r}, which is not a service")
    _check_cycles(services)
    return ComposeProject(os.path.abspath(path), services, list(doc.get("volumes") or {}), doc)


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


def _service(name, spec, base):
    where = f"service {name}"
    if not isinstance(spec, dict):
        raise ComposeError(f"{where}: expected a mapping, not {spec!r}")
    command = _argv(spec.get("entrypoint"), f"{where} entrypoint") + _argv(spec.get("command"), f"{where} command")
    if not command:
        raise ComposeError(f"{where} has no command (zmqflow up runs the command, not the image)")
    return ComposeService(name, command, _environment(spec.get("environment"), where),
                          _healthcheck(spec.get("healthcheck"), where), _depends_on(spec.get("depends_on"), where),
                          [_volume(v, base, where) for v in spec.get("volumes") or []],
                          [int(str(p).split("/")[0]) for p in spec.get("expose") or []])


def _environment(env, where):
    if env is None:
        return {}
    if isinstance(env, list):
        pairs = [item.partition("=") for item in env]
        return {k: v for k, sep, v in pairs if sep}
    if isinstance(env, dict):
        return {str(k): "" if v is None else str(v) for k, v in env.items()}
    raise ComposeError(f"{where} environment: expected a mapping or a list of NAME=value, not {env!r}")


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


def _check_cycles(services):
    state = {}

    def visit(name, path):
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise ComposeError("depends_on has a cycle: " + " -> ".join(path + [name]))
        state[name] = "visiting"
        for dep in services[name].depends_on:
            visit(dep, path + [name])
        state[name] = "done"
    for name in services:
        visit(name, [])


def start_order(services):
    """Names in an order where every service comes after what it depends on (file order otherwise)."""
    order, seen = [], set()

    def visit(name):
        if name in seen:
            return
        seen.add(name)
        for dep in services[name].depends_on:
            visit(dep)
        order.append(name)
    for name in services:
        visit(name)
    return order
