"""A worker fed by reader processes: a reader killed mid-file fails the worker with its name, no hang."""

import json

import pytest

from zmqflow.common.clients import queues
from zmqflow.models.spec import MNIST_MLP
from tests.reader.test_reader_processes import all_reading, readers, wait_for_state

pytestmark = pytest.mark.faults


def test_worker_reports_a_dead_reader_instead_of_ending_quietly(broker, id_shards, processes):
    pattern, _ = id_shards
    procs = readers(broker, processes, 3, "fed", pattern, num_epochs=2, queue_kind="shuffle", capacity=200,
                    min_after_dequeue=50, chunk_size=50)
    queues.attach("fed", broker=broker, timeout=30)
    wait_for_state(broker, "fed", all_reading(3))  # every reader blocked mid-file on the full queue
    procs[1].kill()
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    worker = processes.process("zmqflow.services.worker", ["--broker", broker, "--ps", ps.endpoint, "--queue", "fed",
                                                          "--dequeue-timeout-secs", "60"], name="w")
    assert worker.proc.wait(60) == 3  # a peer lost (deploy/README.md exit codes)
    assert "AbortedError" in worker.log(), worker.log()[-2000:]
