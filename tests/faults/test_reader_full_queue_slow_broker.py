"""Issue 26: a reader whose queue stayed full for minutes exited 3, "lost the broker", though the broker lived.
Its file-name producer pushed each name with a 1 s deadline, retried while the queue was full; the client
gives up a call its service has not answered by the deadline plus a grace (1.1 s) as UnavailableError, so
the one time a starved broker answered an expiry late (a 2-core machine training the CNN) ended the
pipeline. TensorFlow's enqueue waits for room however long. Here the broker is paused (SIGSTOP) for 2.6 s,
past that deadline and grace but within the heartbeats' window (3 s of an unanswered ping), while both of
the reader's queues are full: the reader must keep waiting, and once a consumer drains, deliver every row
exactly once and exit 0; the client library's tf.train.batch threads, which pushed one instance at a time
the same way, too. A broker that is really gone is still found: test_reader_loses_its_broker.py."""

import collections
import json
import signal
import time

import numpy as np
import pytest

from zmqflow.common.clients import queues
from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.errors import OutOfRangeError
from zmqflow.services.reader.input_producers import batch
from tests.support import wait_for

pytestmark = pytest.mark.faults

FILES, ROWS_PER_FILE, CAPACITY = 40, 25, 50   # 40 names: more than the file-name queue's 32
PAUSE_S = 2.6


def pause(broker):
    """The broker alive but answering nothing for PAUSE_S: past a 1 s deadline's grace, within the heartbeats'."""
    broker.signal_group(signal.SIGSTOP)
    try:
        time.sleep(PAUSE_S)
    finally:
        broker.signal_group(signal.SIGCONT)


@pytest.mark.slow   # about 5 s: a reader process, the pause
def test_a_reader_waits_out_a_full_queue_and_a_broker_slow_to_answer(processes, tmp_path):
    for f in range(FILES):
        (tmp_path / f"part-{f:02d}.csv").write_text(
            "".join(f"{f * ROWS_PER_FILE + r},{r / 10}\n" for r in range(ROWS_PER_FILE)))
    broker = processes.service("zmqflow.services.broker")
    reader = processes.process("zmqflow.services.reader", [
        "--broker", broker.endpoint, "--format", "csv", "--files", str(tmp_path / "part-*.csv"),
        "--format-options", json.dumps({"record_defaults": [[0], [0.0]], "columns": {"id": 0, "x": 1}}),
        "--queue", "full", "--queue-kind", "fifo", "--capacity", str(CAPACITY), "--num-epochs", "1",
        "--heartbeat-timeout-secs", "10"])   # the broker's lease on the reader outlasts the pause
    with BrokerClient(broker.endpoint) as client:
        def full():
            sizes = {q["name"]: q["size"] for q in client.list_queues()}
            return sizes.get("full", 0) >= CAPACITY and sizes.get("full.filenames", 0) >= 32
        wait_for(full, 30, "the reader to fill its queue and its file-name queue")
    time.sleep(0.5)   # full for a while: both the name producer and the reading thread wait for room
    pause(broker)
    queue = queues.attach("full", broker=broker.endpoint)
    ids = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ids.extend(queue.dequeue_up_to(100, timeout=10)["id"].tolist())
        except OutOfRangeError:
            break
    wait_for(lambda: not reader.alive(), 15, "the reader to exit")
    assert reader.returncode == 0 and "lost the broker" not in reader.log(), reader.log()[-2000:]
    assert sorted(ids) == list(range(FILES * ROWS_PER_FILE)), collections.Counter(ids).most_common(3)
    assert np.unique(ids).size == FILES * ROWS_PER_FILE


def test_batch_threads_wait_out_a_full_queue_and_a_broker_slow_to_answer(processes):
    broker = processes.service("zmqflow.services.broker")
    rows = 500
    with batch(({"id": i} for i in range(rows)), batch_size=100, capacity=CAPACITY, broker=broker.endpoint,
               timeout=20) as batches:
        with BrokerClient(broker.endpoint) as client:
            wait_for(lambda: any(q["name"] == batches.name and q["size"] >= CAPACITY for q in client.list_queues()),
                     20, "the batch thread to fill its queue")
        time.sleep(0.5)
        pause(broker)
        ids = np.concatenate([b["id"] for b in batches]).tolist()
    assert ids == list(range(rows))
