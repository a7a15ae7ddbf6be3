"""`zmqflow healthcheck`, the image's HEALTHCHECK: a service announces its endpoint, the check pings it."""

import subprocess
import sys

import pytest

from zmqflow.common.rpc import health
from tests.support import free_port

pytestmark = pytest.mark.service


def healthcheck(path, *args):
    return subprocess.run([sys.executable, "-m", "zmqflow", "healthcheck", "--file", str(path), *args],
                          capture_output=True, text=True, timeout=60)


def test_a_service_announces_its_endpoint_and_the_check_pings_it(processes, tmp_path):
    path = tmp_path / "health"
    broker = processes.service("zmqflow.services.broker", env={health.ENV: str(path)})
    assert path.read_text() == broker.endpoint
    done = healthcheck(path)
    assert done.returncode == 0 and "queue-broker up" in done.stdout, done.stderr
    broker.stop()
    done = healthcheck(path, "--timeout-secs", "0.5")
    assert done.returncode == 1 and "UnavailableError" in done.stderr


def test_nothing_announced_client_tasks_and_wildcard_binds(tmp_path):
    done = healthcheck(tmp_path / "missing")
    assert done.returncode == 1 and "no zmqflow task has announced an endpoint" in done.stderr
    (tmp_path / "client").write_text(health.CLIENT)
    assert healthcheck(tmp_path / "client").returncode == 0
    assert health.local_endpoint("tcp://0.0.0.0:5555") == "tcp://127.0.0.1:5555"
    assert health.local_endpoint("tcp://10.0.0.7:5600") == "tcp://10.0.0.7:5600"
    port = free_port()
    (tmp_path / "nobody").write_text(f"tcp://0.0.0.0:{port}")
    done = healthcheck(tmp_path / "nobody", "--timeout-secs", "0.3")
    assert done.returncode == 1 and f"tcp://127.0.0.1:{port}" in done.stderr


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(health.ENV, raising=False)
    health.announce("tcp://127.0.0.1:1")
    assert health.announced() is None
    monkeypatch.setenv(health.ENV, str(tmp_path / "sub" / "health"))
    health.announce("tcp://127.0.0.1:2")
    assert health.announced() == "tcp://127.0.0.1:2"
