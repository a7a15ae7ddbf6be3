import os
import socket

import pytest

from zmqflow.jobs.up.compose import load

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPOSE = os.path.join(ROOT, "docker-compose.yml")
K8S = os.path.join(ROOT, "deploy", "k8s")


@pytest.fixture(scope="session")
def project():
    """The shipped compose file, interpolated with the defaults (no variables set)."""
    return load(COMPOSE, env={})


def compose_ports(project):
    return sorted(p for s in project.services.values() for p in s.expose)


def free_port_offset(ports, tries=50):
    """An offset that moves every port of the topology onto a free loopback port (checked by binding)."""
    import random
    rng = random.Random()
    for _ in range(tries):
        offset = rng.randrange(10_000, 50_000, 100)
        socks = []
        try:
            for port in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port + offset))
            return offset
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port offset found")
