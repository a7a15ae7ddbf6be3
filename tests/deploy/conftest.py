import os

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
