"""The end of a job: the chief can tell the broker to exit (exit 0); a worker that loses a peer exits 3."""

import os
import socket
import subprocess
import sys

from zmqflow.common.processes import start_service
from zmqflow.common.rpc_client import RpcClient

ZMQFLOW = os.path.join(os.path.dirname(sys.executable), "zmqflow")


def test_broker_shutdown_op_exits_zero(tmp_path):
    broker = start_service("zmqflow.services.broker", log_dir=str(tmp_path))
    try:
        with RpcClient(broker.endpoint) as client:
            result, _ = client.call("shutdown", {"by": "the test"}, timeout=5)
        assert result == {"queues": 0}
        assert broker.proc.wait(timeout=10) == 0
        assert "shutting down (asked by the test)" in broker.log()
    finally:
        broker.stop()


def test_worker_that_cannot_reach_its_peers_exits_3():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    done = subprocess.run([ZMQFLOW, "worker", "--ps", dead, "--broker", dead, "--backend", "numpy"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "UnavailableError" in done.stderr and dead in done.stderr
