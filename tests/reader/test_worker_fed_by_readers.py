"""A worker fed by reader processes: a reader killed mid-file fails the worker with its name, no hang."""

import json

from zmqflow.common import queues
from zmqflow.models.spec import MNIST_MLP
from zmqflow.common.processes import start_process, start_service
from tests.reader.test_reader_processes import all_reading, readers, stop_all, wait_for_record


def test_worker_reports_a_dead_reader_instead_of_ending_quietly(broker, id_shards, tmp_path):
    pattern, _ = id_shards
    procs = readers(broker, tmp_path, 3, "fed", pattern, num_epochs=2, queue_kind="shuffle", capacity=200,
                    min_after_dequeue=50, chunk_size=50)
    try:
        queues.attach("fed", broker=broker, timeout=30)
        wait_for_record(broker, "fed", all_reading(3))  # every reader blocked mid-file on the full queue
        victim = procs[1]
        victim.kill()
        ps = start_service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)], log_dir=str(tmp_path))
        procs.append(ps)
        worker = start_process("zmqflow.services.worker", ["--broker", broker, "--ps", ps.endpoint, "--queue", "fed",
                                                   "--dequeue-timeout", "60"], log_dir=str(tmp_path), name="w")
        procs.append(worker)
        assert worker.proc.wait(60) == 3  # a peer lost (deploy/README.md exit codes)
        assert "AbortedError" in worker.log(), worker.log()[-2000:]
    finally:
        stop_all(procs)
