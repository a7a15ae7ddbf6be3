"""Sync training with at-least-once input ends without a stall when the replicas get uneven batches.

At the end of the input a worker waits on the closed queue while another holds a leased batch (it
may come back); that other worker's step waits for every replica. Acking a batch as soon as the ps
answered its push (before the wait for the others) lets the waiting worker see OutOfRange at once.
Acked after the whole exchange instead, they waited on each other until the ps gave up on a replica.
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

pytestmark = pytest.mark.integration

ROWS = 300   # 3 batches of 100 for 2 replicas: the last step has one batch only


def test_sync_workers_with_leases_end_at_once_on_uneven_batches(processes):
    (x, y), _ = mnist_split()
    broker = processes.service("zmqflow.services.broker")
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP), "--mode", "sync",
                                                  "--replicas-to-aggregate", "2", "--total-num-replicas", "2",
                                                  "--lost-after-secs", "60"])   # a stall shows, not hidden by the rule
    queue = FIFOQueue(ROWS, ["float32", "int32"], shapes=[[784], []], names=["image", "label"], shared_name="train",
                      broker=broker.endpoint)
    queue.enqueue_many({"image": x[:ROWS], "label": y[:ROWS].astype(np.int32)}, timeout=10)
    queue.close(timeout=5)
    started = time.monotonic()
    workers = [processes.process("zmqflow.services.worker", [
        "--broker", broker.endpoint, "--ps", ps.endpoint, "--num-workers", "2", "--task-index", str(i),
        "--mode", "sync", "--backend", "numpy", "--at-least-once"]) for i in range(2)]
    wait_for(lambda: not any(w.alive() for w in workers), 60, "both workers to exit")
    took = time.monotonic() - started
    with BrokerClient(broker.endpoint) as client:
        train = next(q for q in client.list_queues() if q["name"] == "train")
    logs = [w.log() for w in workers]
    print(f"\nsync, at-least-once, 3 batches for 2 replicas: both workers started and done in {took:.1f} s (a stall "
          f"lasts the 30 s sync timeout); {train['lease_acked']} of {ROWS} rows acked")
    assert [w.returncode for w in workers] == [0, 0], [log[-1500:] for log in logs]
    assert train["lease_acked"] == ROWS and train["leased"] == 0
    assert took <= 20.0
