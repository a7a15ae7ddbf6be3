"""The gateway as deployments operate it: it announces its URL for the image's HEALTHCHECK (`zmqflow healthcheck`
then asks its /v2/health/ready), `--http URL` checks any URL, and --metrics-bind serves its infer requests."""

import importlib.util
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from zmqflow.common.rpc import health
from tests.gateway.plain_http import infer_json
from tests.support import free_port

pytestmark = pytest.mark.service


def healthcheck(*args):
    return subprocess.run([sys.executable, "-m", "zmqflow", "healthcheck", *args], capture_output=True, text=True,
                          timeout=60)


def test_healthcheck_and_metrics_of_a_gateway(topology, processes, tmp_path):
    announced, metrics_port = tmp_path / "health", free_port()
    gateway = processes.service("zmqflow.services.gateway", ["--aggregator", topology.aggregator.endpoint,
                                                             "--metrics-bind", str(metrics_port)],
                                bind="127.0.0.1:0", env={health.ENV: str(announced)})
    assert announced.read_text() == gateway.endpoint
    done = healthcheck("--file", str(announced))
    assert done.returncode == 0 and "/v2/health/ready: HTTP 200" in done.stdout, done.stderr
    done = healthcheck("--http", f"{gateway.endpoint}/v2/models/nobody/ready", "--timeout-secs", "5")
    assert done.returncode == 1 and "HTTP 404" in done.stderr and "nobody" in done.stderr

    x = np.zeros((1, 784), np.float32)
    assert infer_json(gateway.endpoint, "ensemble", x).status == 200
    assert infer_json(gateway.endpoint, "m2", x).status == 200
    assert infer_json(gateway.endpoint, "no-such-model", x).status == 404
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'zmqflow_gateway_infer_requests_total{model="ensemble",status="200",task="gateway"} 1.0' in text
    assert 'zmqflow_gateway_infer_requests_total{model="m2",status="200",task="gateway"} 1.0' in text
    assert 'zmqflow_gateway_infer_requests_total{model="(unknown)",status="404",task="gateway"} 1.0' in text
    assert 'zmqflow_gateway_infer_duration_seconds_count{model="ensemble",task="gateway"} 1.0' in text

    gateway.stop()
    assert gateway.returncode == 0, gateway.log()   # SIGTERM: a clean stop, as every service's
    done = healthcheck("--file", str(announced), "--timeout-secs", "1")
    assert done.returncode == 1 and "/v2/health/ready" in done.stderr


def test_the_gateway_runs_on_uvloop_where_it_is_installed(topology):
    """uvicorn's loop="auto" (services/gateway/server.py): uvloop, the http extra's, when it can be imported (less
    of the gateway's CPU a request, docs/performance.md), asyncio where it cannot; the gateway's interpreter is
    this one's, so it has uvloop exactly when this process finds it."""
    with open(f"/proc/{topology.gateway_pid}/maps") as f:
        on_uvloop = "uvloop" in f.read()
    assert on_uvloop == (importlib.util.find_spec("uvloop") is not None)
