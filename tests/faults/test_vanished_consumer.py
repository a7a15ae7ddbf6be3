"""Issue: a client SIGKILLed while parked in dequeue_many kept its request alive until the broker's
30 s client timeout; elements enqueued meanwhile were handed to the dead request and lost (100 of
130). The broker sees the connection drop (its socket monitor) and cancels the dead client's parked
requests at once: nothing enqueued afterwards is handed to it."""

import subprocess
import sys
import time

import numpy as np
import pytest

from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.clients.queues import FIFOQueue
from tests.support import wait_for

pytestmark = pytest.mark.faults

CONSUMER = """
import sys
from zmqflow.common.clients.queues import FIFOQueue
queue = FIFOQueue(1000, ["int32"], shapes=[[]], shared_name="work", broker=sys.argv[1])
print("parked", flush=True)
queue.dequeue_many(100, timeout=600)
"""


def waiting_dequeues(client):
    return sum(q["waiting_dequeues"] for q in client.list_queues() if q["name"] == "work")


def test_a_killed_consumer_is_dropped_at_once_and_no_element_is_lost(processes):
    broker = processes.service("zmqflow.services.broker")   # its client timeout: 30 s, the old bound
    queue = FIFOQueue(1000, ["int32"], shapes=[[]], shared_name="work", broker=broker.endpoint)
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, broker.endpoint], stdout=subprocess.PIPE, text=True)
    try:
        assert consumer.stdout.readline().strip() == "parked"
        with BrokerClient(broker.endpoint) as client:
            wait_for(lambda: waiting_dequeues(client) == 1, 10, "the consumer's dequeue_many to park")
            consumer.kill()
            killed = time.monotonic()
            wait_for(lambda: waiting_dequeues(client) == 0, 5, "the broker to drop the dead consumer's request")
            took = time.monotonic() - killed
        queue.enqueue_many([np.arange(130, dtype=np.int32)], timeout=10)
        got = queue.dequeue_many(130, timeout=10)
        print(f"\ndead consumer's dequeue_many dropped {took * 1000:.0f} ms after the kill; {len(got)} of 130 "
              "elements enqueued afterwards dequeued")
        assert took <= 2.0 and sorted(got.tolist()) == list(range(130))
    finally:
        consumer.kill()
        consumer.wait(5)
