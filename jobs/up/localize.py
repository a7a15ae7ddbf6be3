"""Map a compose service onto this machine: hosts -> 127.0.0.1, ports + offset, volumes -> local dirs.

`tcp://ps0:5601` (a compose service name, or 0.0.0.0 / * / localhost) becomes
`tcp://127.0.0.1:<5601 + offset>`, in the command, the healthcheck and every
environment value (TF_CONFIG's JSON included, since its addresses are the same
`host:port` text). Only ports on those hosts move, so one offset shifts the
whole topology and nothing else.
"""

import os
import re
import sys
from dataclasses import dataclass, field

from zmqflow.common.processes.children import compute_thread_env

LOCAL_HOSTS = ("0.0.0.0", "*", "localhost", "127.0.0.1")
COMPUTE_COMMANDS = ("worker", "serve")   # the zmqflow commands that run BLAS/numba kernels


@dataclass
class LocalService:
    name: str
    argv: list
    env: dict                 # only what the service sets; the runner adds the parent's environment
    health: list | None       # the healthcheck argv, localized
    depends_on: dict
    check: object = None      # the compose Healthcheck (timings)
    dirs: list = field(default_factory=list)   # local volume directories to create
    restart: object = None    # the compose RestartPolicy
    ports: list = field(default_factory=list)  # the ports it listens on here (its `expose:`, moved by the offset)


class Localizer:
    """Rewrites text for one project: `localize(service)` -> LocalService."""

    def __init__(self, service_names, port_offset=0, workdir=".zmqflow-up"):
        names = sorted(set(service_names) | set(LOCAL_HOSTS), key=len, reverse=True)
        self._address = re.compile(r"(?<![\w.\-])(" + "|".join(map(re.escape, names)) + r"):(\d{1,5})(?![\d])")
        self.port_offset, self.workdir = port_offset, os.path.abspath(workdir)

    def address(self, text):
        def move(match):
            port = int(match.group(2)) + self.port_offset
            if not 0 < port <= 65535:
                raise ValueError(f"port {match.group(2)} + offset {self.port_offset} is out of range")
            return f"127.0.0.1:{port}"
        return self._address.sub(move, text)

    def volume_dirs(self, service):
        """[(container path, local dir)], longest path first so /data/ckpt wins over /data."""
        pairs = [(v.target, v.source if v.bind else os.path.join(self.workdir, v.source)) for v in service.volumes]
        return sorted(pairs, key=lambda p: len(p[0]), reverse=True)

    def text(self, value, volumes):
        value = self.address(value)
        for target, local in volumes:
            value = re.sub(r"(?<![\w.\-/])" + re.escape(target) + r"(?=/|\Z|[^\w.\-])", lambda _: local, value)
        return value

    def localize(self, service):
        volumes = self.volume_dirs(service)
        argv = [self.text(arg, volumes) for arg in service.command]
        health = [self.text(arg, volumes) for arg in service.healthcheck.test] if service.healthcheck else None
        env = {key: self.text(value, volumes) for key, value in service.environment.items()}
        return LocalService(service.name, argv, env, health, dict(service.depends_on), service.healthcheck,
                            [local for _, local in volumes], service.restart,
                            [port + self.port_offset for port in service.expose])


def child_environment(service_env):
    """The parent's environment, this Python's bin directory first on PATH (so `zmqflow` and `python`
    are this installation's), unbuffered output, then what the service sets."""
    env = dict(os.environ)
    bin_dir = os.path.dirname(sys.executable)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(service_env)
    return env


def share_cores(services, cores=None):
    """Cap the BLAS/numba threads of each compute service (workers, model servers) to its share of this
    machine's cores, unless the service sets them itself.

    In containers each service has its own cores; run here side by side, three model servers and two
    workers with a BLAS pool each as wide as the machine spin against each other (a 64-row predict took
    130 ms instead of 3 ms with 3 servers on 2 cores)."""
    compute = [s for s in services if len(s.argv) > 1 and s.argv[1] in COMPUTE_COMMANDS]
    if not compute:
        return services
    share = compute_thread_env(max(1, (cores or os.cpu_count() or 1) // len(compute)))
    for service in compute:
        if not share.keys() & service.env.keys():
            service.env.update(share)
    return services
