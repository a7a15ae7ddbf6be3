"""Issue: with its only reader SIGKILLed, a worker waited the whole dequeue timeout (600 s). The reader
is a registered producer of the queue: the broker sees its connection drop (or its beats stop within
its lease, 3.5 s), fails the queue, and answers the worker's dequeue with a clear error naming the
reader, so the worker ends, exit 3 (a peer lost), within seconds."""

import time

import pytest

from zmqflow.common.clients import queues
from zmqflow.inputs.datasets import mnist_split, write_record_shards
from tests.support import wait_for

pytestmark = pytest.mark.faults


def test_workers_end_within_seconds_when_their_only_reader_is_killed(processes, tmp_path):
    import json
    from zmqflow.models.spec import MNIST_MLP
    (x, y), _ = mnist_split()
    write_record_shards(x, y, str(tmp_path / "shards"))
    broker = processes.service("zmqflow.services.broker")
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    reader = processes.process("zmqflow.services.reader", [
        "--broker", broker.endpoint, "--preset", "mnist-shards", "--files", str(tmp_path / "shards" / "*.bin"),
        "--num-epochs", "500", "--capacity", "1000"])
    worker = processes.process("zmqflow.services.worker", ["--broker", broker.endpoint, "--ps", ps.endpoint,
                                                           "--backend", "numpy", "--log-every", "20"])
    wait_for(lambda: "Step:" in worker.log(), 60, "the worker to train")
    queue = queues.attach("train", broker=broker.endpoint)
    reader.kill()
    killed = time.monotonic()
    wait_for(lambda: queue.producers()["closed"] == "failed", 20, "the pipeline to be failed", interval=0.05)
    failed = time.monotonic() - killed
    wait_for(lambda: not worker.alive(), 20, "the worker to end")
    took = time.monotonic() - killed
    log = worker.log()
    print(f"\nonly reader SIGKILLed: its pipeline failed after {failed:.2f} s (lease 3.5 s), the worker ended after "
          f"{took:.2f} s, exit {worker.returncode}")
    assert failed <= 5.0, log[-2000:]                               # the bound
    assert worker.returncode == 3 and took <= 7.0, log[-2000:]      # 3: a peer lost (deploy/README.md)
    assert "stopped beating" in log and "lease 3.5 s" in log
