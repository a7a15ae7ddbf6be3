"""The end of a job: the chief can tell the broker to exit (exit 0); a worker that loses a peer exits 3."""

import os
import subprocess
import sys

import pytest

from zmqflow.common.rpc.client import RpcClient
from tests.support import free_port

pytestmark = pytest.mark.service

ZMQFLOW = os.path.join(os.path.dirname(sys.executable), "zmqflow")


def test_broker_shutdown_op_exits_zero(processes):
    broker = processes.service("zmqflow.services.broker")
    with RpcClient(broker.endpoint) as client:
        result, _ = client.call("shutdown", {"by": "the test"}, timeout=5)
    assert result == {"queues": 0}
    assert broker.proc.wait(timeout=10) == 0
    assert "shutting down (asked by the test)" in broker.log()


def test_worker_that_cannot_reach_its_peers_exits_3():
    dead = f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run([ZMQFLOW, "worker", "--ps", dead, "--broker", dead, "--backend", "numpy"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "UnavailableError" in done.stderr and dead in done.stderr
