"""At-least-once input for training: a worker SIGKILLed mid-step with --at-least-once loses no batch.

Its leased batches (the one in hand, the prefetched one, the one whose push was in flight) go back
to the queue when its connection drops, and the other worker trains on them: the broker's acked
count is exactly the rows fed (nothing lost, nothing acked twice), the returned elements are at
least one batch, and the surviving worker ends on the closed queue's OutOfRange, exit 0.
"""

import json
import time

import numpy as np
import pytest

from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.inputs.datasets import mnist_split
from zmqflow.models.spec import MNIST_MLP
from tests.support import wait_for

pytestmark = pytest.mark.faults

ROWS = 12000
BATCH = 20   # small batches: some 600 steps, so the kill lands mid-training even when the other worker starts
#              well ahead of the chief (with 3,000 rows, under the full suite's load, it once drained the queue
#              before the kill: the chief had ended, holding no lease)


def test_a_killed_workers_leased_batches_are_trained_by_the_other(processes, tmp_path):
    (x, y), _ = mnist_split()
    x, y = np.resize(x, (ROWS, x.shape[1])), np.resize(y, ROWS)   # the sample's rows, repeated up to ROWS
    broker = processes.service("zmqflow.services.broker")
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    queue = FIFOQueue(ROWS, ["float32", "int32"], shapes=[[784], []], names=["image", "label"], shared_name="train",
                      broker=broker.endpoint)
    queue.enqueue_many({"image": x[:ROWS], "label": y[:ROWS].astype(np.int32)}, timeout=10)
    queue.close(timeout=5)

    def worker(index):
        return processes.process("zmqflow.services.worker", [
            "--broker", broker.endpoint, "--ps", ps.endpoint, "--num-workers", "2", "--task-index", str(index),
            "--backend", "numpy", "--log-every", "5", "--batch-size", str(BATCH), "--at-least-once",
            "--json-out", str(tmp_path / f"worker{index}.json")])

    chief, other = worker(0), worker(1)
    wait_for(lambda: "Step:" in chief.log() and "Step:" in other.log(), 60, "both workers to train")
    with BrokerClient(broker.endpoint) as client:
        chief.kill()
        killed = time.monotonic()
        wait_for(lambda: client.info()["leases"]["client_gone"] > 0, 5, "the killed worker's leases to return")
        back = time.monotonic() - killed
        wait_for(lambda: not other.alive(), 60, "the other worker to finish the queue")
        counts = client.info()["leases"]
    summary = json.loads((tmp_path / "worker1.json").read_text())
    print(f"\nworker killed mid-step with --at-least-once: {counts['client_gone']} leased elements back "
          f"{back * 1000:.0f} ms after the SIGKILL; {counts['acked']} of {ROWS} acked, 0 lost; the other worker "
          f"trained {summary['examples']} examples ({summary['leased_acked']} acked by it); broker counts {counts}")
    assert other.returncode == 0, other.log()[-2000:]
    assert back <= 2.0 and counts["client_gone"] >= BATCH          # at least the prefetched batch came back
    assert counts["acked"] == ROWS and counts["open"] == 0         # every row acked once: none lost
    assert counts["leased"] == ROWS + counts["client_gone"]        # the returned ones were leased again
    assert summary["leased_acked"] == summary["examples"] >= counts["client_gone"]
