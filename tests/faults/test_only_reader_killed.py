"""Issue: with its only reader SIGKILLed, a worker waited the whole dequeue timeout (600 s). The worker
watches the reader pipeline while it waits for a batch, as the readers watch each other: the dead
reader's lease (4 s) runs out, the pipeline is failed and its queues closed, and the worker ends with
a clear error naming the reader, exit 3 (a peer lost), within seconds."""

import time

import pytest

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
    reader.kill()
    killed = time.monotonic()
    wait_for(lambda: not worker.alive(), 20, "the worker to end")
    took = time.monotonic() - killed
    log = worker.log()
    print(f"\nworker ended {took:.1f} s after its only reader was killed, exit {worker.returncode}")
    assert worker.returncode == 3 and took <= 7.0, log[-2000:]      # 3: a peer lost (deploy/README.md)
    assert "stopped beating" in log and "lease 4.0 s" in log
