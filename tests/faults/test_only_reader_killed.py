"""Issue: with its only reader SIGKILLed, a worker waited the whole dequeue timeout (600 s). The worker
watches the reader pipeline while it waits for a batch, as the readers watch each other: the dead
reader's lease (3.5 s) runs out, the pipeline is failed and its queues closed, and the worker ends with
a clear error naming the reader, exit 3 (a peer lost), within seconds."""

import time

import pytest

from zmqflow.common.input_pipeline import PipelineRegister
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
    register = PipelineRegister.find(broker.endpoint, "train", token_wait_s=5)
    reader.kill()
    killed = time.monotonic()
    wait_for(lambda: register.read().failed, 20, "the pipeline to be failed", interval=0.05)
    failed = time.monotonic() - killed
    wait_for(lambda: not worker.alive(), 20, "the worker to end")
    took = time.monotonic() - killed
    log = worker.log()
    print(f"\nonly reader SIGKILLed: its pipeline failed after {failed:.2f} s (lease 3.5 s), the worker ended after "
          f"{took:.2f} s, exit {worker.returncode}")
    assert failed <= 5.0, log[-2000:]                               # the bound
    assert worker.returncode == 3 and took <= 7.0, log[-2000:]      # 3: a peer lost (deploy/README.md)
    assert "stopped beating" in log and "lease 3.5 s" in log
