"""The broker's --max-* options over ZeroMQ: RESOURCE_EXHAUSTED naming the limit, and the broker keeps serving."""

import numpy as np
import pytest

from zmqflow.common.errors import ResourceExhaustedError
from zmqflow.common.clients.queues import FIFOQueue, reset
from zmqflow.common.rpc.client import RpcClient
from zmqflow.services.broker.queues.quota import element_overhead

ROW = 1024 + element_overhead(1)    # what one 1 KiB element costs the broker: its data and its objects

pytestmark = pytest.mark.service


def test_broker_limits_refuse_with_resource_exhausted(processes):
    proc = processes.service("zmqflow.services.broker", ["--max-container-bytes", str(4 * ROW), "--max-total-bytes", str(6 * ROW),
                                                         "--max-queues", "4", "--max-queues-per-container", "2",
                                                         "--max-queue-capacity", "100"])
    b = proc.endpoint
    q = FIFOQueue(100, "float32", shapes=[[256]], shared_name="a", container="c1", broker=b)  # 1 KiB rows
    q.enqueue_many([np.ones((4, 256), np.float32)])
    with pytest.raises(ResourceExhaustedError, match=rf"max_container_bytes limit \({4 * ROW}\)"):
        q.enqueue(np.ones(256, np.float32))
    q.dequeue()
    q.enqueue(np.ones(256, np.float32), timeout=5)  # a dequeue made room
    other = FIFOQueue(100, "float32", shapes=[[256]], shared_name="b", container="c2", broker=b)
    other.enqueue_many([np.ones((2, 256), np.float32)])
    with pytest.raises(ResourceExhaustedError, match=rf"max_total_bytes limit \({6 * ROW}\)"):
        other.enqueue(np.ones(256, np.float32))
    with pytest.raises(ResourceExhaustedError, match=r"max_queue_capacity limit \(100\)"):
        FIFOQueue(-1, "float32", shapes=[[256]], shared_name="x", container="c2", broker=b)
    FIFOQueue(10, "int32", shapes=[[]], shared_name="c", container="c1", broker=b)
    with pytest.raises(ResourceExhaustedError, match=r"max_queues_per_container limit \(2\)"):
        FIFOQueue(10, "int32", shapes=[[]], shared_name="d", container="c1", broker=b)
    FIFOQueue(10, "int32", shapes=[[]], shared_name="d", container="c3", broker=b)
    with pytest.raises(ResourceExhaustedError, match=r"max_queues limit \(4\)"):
        FIFOQueue(10, "int32", shapes=[[]], shared_name="e", container="c3", broker=b)
    with RpcClient(b) as client:
        info = client.call("info", timeout=5)[0]
    assert info["bytes"] == 6 * ROW and info["limits"]["max_total_bytes"] == 6 * ROW
    reset("c1", broker=b)
    other.enqueue(np.ones(256, np.float32), timeout=5)  # the reset freed c1's bytes
    assert proc.alive()


def test_bad_limit_options_are_refused(tmp_path):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "zmqflow.services.broker", "--max-total-bytes", "lots"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "is not a byte count" in out.stderr
