"""A consumer SIGKILLed while parked in dequeue_many, and elements enqueued before the broker reads its
socket monitor's disconnect event: the answer to the dead request used to vanish with its elements (a
ROUTER drops a message to a peer that is gone). Now that reply fails at once (ROUTER_MANDATORY) and the
elements go back to the queue. The monitor is taken out of the broker's loop here, so that the reply and
not the monitor meets the dead client first: the window the monitor alone leaves open, made as wide as
the test needs. The broker runs in this process (a thread) for that; the consumer is a real process."""

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.services.broker.server import BrokerService
from tests.faults.test_vanished_consumer import CONSUMER, waiting_dequeues
from tests.support import wait_for

pytestmark = pytest.mark.faults


@pytest.fixture
def broker_without_monitor():
    context = zmq.Context()
    broker = BrokerService("tcp://127.0.0.1:0", context=context)
    broker.remove_socket(broker._monitor)   # disconnects go unseen: only a reply can find the client gone
    broker._watch_connections = lambda: None
    thread = threading.Thread(target=broker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield broker.endpoint
    finally:
        broker.stop()
        thread.join(5)
        context.destroy(0)


def test_an_answer_the_dead_consumer_cannot_get_puts_its_elements_back(broker_without_monitor):
    endpoint = broker_without_monitor
    queue = FIFOQueue(1000, ["int32"], shapes=[[]], shared_name="work", broker=endpoint)
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, endpoint], stdout=subprocess.PIPE, text=True)
    try:
        assert consumer.stdout.readline().strip() == "parked"
        with BrokerClient(endpoint) as client:
            wait_for(lambda: waiting_dequeues(client) == 1, 10, "the consumer's dequeue_many to park")
            consumer.kill()
            consumer.wait(5)
            time.sleep(0.3)   # the broker's socket has seen the connection close; its dequeue is still parked
            assert waiting_dequeues(client) == 1
            queue.enqueue_many([np.arange(130, dtype=np.int32)], timeout=10)   # completes the dead dequeue
            got = queue.dequeue_many(130, timeout=5)
        print(f"\nthe dead consumer's answer could not be delivered: {len(got)} of 130 elements dequeued by "
              "another client")
        assert sorted(got.tolist()) == list(range(130))
    finally:
        consumer.kill()
        consumer.wait(5)
