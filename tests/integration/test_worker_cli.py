"""The worker command as a user runs it: cluster from TF_CONFIG, end of input, its result file."""

import json

import pytest

from zmqflow.inputs.datasets import mnist_split
from zmqflow.models.spec import MNIST_MLP
from zmqflow.common.clients.queues import FIFOQueue

pytestmark = pytest.mark.integration


def test_chief_from_tf_config_trains_until_end_of_input(processes, tmp_path):
    (x, y), _ = mnist_split()
    broker = processes.service("zmqflow.services.broker")
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    queue = FIFOQueue(1000, ["float32", "int32"], shapes=[[784], []], names=["image", "label"],
                      shared_name="train", broker=broker.endpoint)
    queue.enqueue_many({"image": x[:350], "label": y[:350]})
    queue.close()
    ps_address = ps.endpoint.split("//")[1]
    tf_config = {"cluster": {"chief": ["127.0.0.1:1"], "ps": [ps_address]}, "task": {"type": "chief", "index": 0}}
    result = tmp_path / "result.json"
    worker = processes.process("zmqflow.services.worker", ["--broker", broker.endpoint, "--json-out", str(result),
                                                          "--shutdown-ps"],
                               env={"TF_CONFIG": json.dumps(tf_config)}, name="chief")
    assert worker.proc.wait(120) == 0, worker.log()
    summary = json.loads(result.read_text())
    assert summary["examples"] == 350 and summary["steps"] == 4  # 3 full batches and the last 50
    assert summary["global_step"] == 4
    assert ps.proc.wait(10) == 0  # the chief shut the shard down: every task exits 0
    assert "placement over 1 ps shards" in worker.log()


def test_worker_without_input_names_the_queue_and_exits_nonzero(processes):
    broker = processes.service("zmqflow.services.broker")
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    FIFOQueue(10, ["float32", "int32"], shapes=[[784], []], names=["image", "label"], shared_name="idle",
              broker=broker.endpoint)  # nobody ever feeds it
    worker = processes.process("zmqflow.services.worker", ["--broker", broker.endpoint, "--ps", ps.endpoint,
                                                          "--queue", "idle", "--dequeue-timeout-secs", "1"], name="w")
    assert worker.proc.wait(60) != 0
    assert "no mini-batch from queue 'idle'" in worker.log()
