"""The worker command as a user runs it: cluster from TF_CONFIG, end of input, its result file."""

import json

import numpy as np

from zmqflow.inputs.datasets import mnist_split
from zmqflow.models.spec import MNIST_MLP
from zmqflow.common.processes import start_process, start_service
from zmqflow.common.queues import FIFOQueue


def test_chief_from_tf_config_trains_until_end_of_input(tmp_path):
    (x, y), _ = mnist_split()
    broker = start_service("zmqflow.services.broker", log_dir=str(tmp_path))
    procs = [broker]
    try:
        ps = start_service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)], log_dir=str(tmp_path))
        procs.append(ps)
        queue = FIFOQueue(1000, ["float32", "int32"], shapes=[[784], []], names=["image", "label"],
                          shared_name="train", broker=broker.endpoint)
        queue.enqueue_many({"image": x[:350], "label": y[:350]})
        queue.close()
        ps_address = ps.endpoint.split("//")[1]
        tf_config = {"cluster": {"chief": ["127.0.0.1:1"], "ps": [ps_address]}, "task": {"type": "chief", "index": 0}}
        result = tmp_path / "result.json"
        worker = start_process("zmqflow.services.worker", ["--broker", broker.endpoint, "--result-file", str(result),
                                                   "--shutdown-ps"],
                               env={"TF_CONFIG": json.dumps(tf_config)}, log_dir=str(tmp_path), name="chief")
        procs.append(worker)
        assert worker.proc.wait(120) == 0, worker.log()
        summary = json.loads(result.read_text())
        assert summary["examples"] == 350 and summary["steps"] == 4  # 3 full batches and the last 50
        assert summary["global_step"] == 4
        assert ps.proc.wait(10) == 0  # the chief shut the shard down: every task exits 0
        assert "placement over 1 ps shards" in worker.log()
    finally:
        for p in reversed(procs):
            p.stop()


def test_worker_without_input_names_the_queue_and_exits_nonzero(tmp_path):
    broker = start_service("zmqflow.services.broker", log_dir=str(tmp_path))
    procs = [broker]
    try:
        ps = start_service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)], log_dir=str(tmp_path))
        procs.append(ps)
        FIFOQueue(10, ["float32", "int32"], shapes=[[784], []], names=["image", "label"], shared_name="idle",
                  broker=broker.endpoint)  # nobody ever feeds it
        worker = start_process("zmqflow.services.worker", ["--broker", broker.endpoint, "--ps", ps.endpoint, "--queue", "idle",
                                                   "--dequeue-timeout", "1"], log_dir=str(tmp_path), name="w")
        procs.append(worker)
        assert worker.proc.wait(60) != 0
        assert "no mini-batch from queue 'idle'" in worker.log()
    finally:
        for p in reversed(procs):
            p.stop()
