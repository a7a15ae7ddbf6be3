"""At-least-once dequeues: a consumer SIGKILLed while it holds a leased batch loses nothing.

Issue: a client killed while parked in `dequeue_many` swallowed elements (first half: its parked
requests are cancelled at once, test_vanished_consumer.py). A consumer killed *after* its batch
arrived still took the batch with it. With a lease the broker keeps the batch until the ack; the
dropped connection gives it back within the bound, and another consumer gets every element: the
acked elements are exactly the enqueued ones, nothing lost, nothing acked twice. A consumer alive
but silent past its lease gets the same treatment when the lease expires, and its late ack says so.
"""

import subprocess
import sys
import time

import numpy as np
import pytest

from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.clients.queues import FIFOQueue
from tests.support import wait_for

pytestmark = pytest.mark.faults

ELEMENTS = 300

CONSUMER = """
import sys
from zmqflow.common.errors import OpError
from zmqflow.common.clients.queues import FIFOQueue
queue = FIFOQueue(1000, ["int32"], shapes=[[]], shared_name="work", broker=sys.argv[1])
lease_s = float(sys.argv[2])
with queue.dequeue_many(50, timeout=10, lease=lease_s) as done:          # one batch processed and acked
    print("acked", *done.tolist(), flush=True)
held = queue.dequeue_many(100, timeout=10, lease=lease_s)                 # the next one is in hand when
print("holding", *held.values.tolist(), flush=True)                       # the consumer dies (or stalls)
sys.stdin.readline()
try:
    held.ack()
    print("ack ok", flush=True)
except OpError as error:
    print("ack failed", type(error).__name__, error, flush=True)
"""


def start_consumer(endpoint, lease_s):
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, endpoint, str(lease_s)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    acked = consumer.stdout.readline().split()
    held = consumer.stdout.readline().split()
    assert acked[0] == "acked" and held[0] == "holding", (acked, held)
    return consumer, [int(v) for v in acked[1:]], [int(v) for v in held[1:]]


def leased(client):
    return sum(q["leased"] for q in client.list_queues() if q["name"] == "work")


def drain_with_leases(queue):
    """Everything left (250), dequeued by another consumer in leased batches of 50, each acked."""
    acked = []
    while queue.size():
        with queue.dequeue_many(50, timeout=5, lease=30) as batch:
            acked.extend(batch.tolist())
    return acked


def start_work(processes, *broker_args):
    broker = processes.service("zmqflow.services.broker", broker_args)
    queue = FIFOQueue(1000, ["int32"], shapes=[[]], shared_name="work", broker=broker.endpoint)
    queue.enqueue_many([np.arange(ELEMENTS, dtype=np.int32)], timeout=10)
    return broker, queue


@pytest.fixture
def work(processes):
    return start_work(processes)   # client timeout 30 s: only the disconnect or the lease's expiry counts


def test_a_killed_consumers_leased_batch_returns_and_nothing_is_lost(work):
    broker, queue = work
    consumer, acked_by_killed, held = start_consumer(broker.endpoint, 60)
    try:
        with BrokerClient(broker.endpoint) as client:
            assert leased(client) == 100 and queue.size() == ELEMENTS - 150
            consumer.kill()
            killed = time.monotonic()
            wait_for(lambda: leased(client) == 0 and queue.size() == ELEMENTS - 50, 5,
                     "the killed consumer's leased batch to return to the queue")
            took = time.monotonic() - killed
            counts = client.info()["leases"]
        acked = drain_with_leases(queue)
    finally:
        consumer.kill()
        consumer.wait(5)
    redelivered = set(held) & set(acked)
    every = acked_by_killed + acked
    print(f"\nkilled consumer's leased batch of {len(held)} back in the queue {took * 1000:.0f} ms after the "
          f"SIGKILL; {len(every)} of {ELEMENTS} elements acked, {len(redelivered)} delivered twice (the dead "
          f"consumer's batch), 0 lost; broker counts {counts}")
    assert took <= 2.0
    assert sorted(every) == list(range(ELEMENTS))                         # none lost, none acked twice
    assert redelivered == set(held) and acked[:100] == held                # its batch came back first, in order
    assert counts["client_gone"] >= 100


def test_a_silent_consumers_lease_expires_and_its_late_ack_is_refused(work):
    broker, queue = work
    consumer, acked_by_stalled, held = start_consumer(broker.endpoint, 0.5)
    granted = time.monotonic()
    try:
        with BrokerClient(broker.endpoint) as client:
            wait_for(lambda: leased(client) == 0, 5, "the silent consumer's lease to expire")
            back = time.monotonic() - granted
            counts = client.info()["leases"]
        acked = drain_with_leases(queue)
        consumer.stdin.write("ack now\n")
        consumer.stdin.flush()
        late = consumer.stdout.readline().strip()
        assert consumer.wait(10) == 0
    finally:
        consumer.kill()
        consumer.wait(5)
    print(f"\nlease of 0.5 s held by a live, silent consumer: its {len(held)} elements back {back:.2f} s after "
          f"the grant; late ack: {late}")
    assert back <= 2.0 and counts["expired"] == 100 and counts["client_gone"] == 0   # expired, not dropped
    assert sorted(acked_by_stalled + acked) == list(range(ELEMENTS)) and acked[:100] == held
    assert late.startswith("ack failed FailedPreconditionError") and "expired after 0.5 s" in late


def test_a_lease_holder_silent_past_the_client_timeout_is_still_watched(processes):
    """A long step sends nothing; the broker forgets silent clients after --client-timeout-secs, but not
    one that holds a lease: its connection stays watched, so its death is still noticed at once."""
    broker, queue = start_work(processes, "--client-timeout-secs", "1")
    consumer, _, held = start_consumer(broker.endpoint, 60)
    try:
        time.sleep(2.5)                                  # two sweeps past the client timeout, silent
        with BrokerClient(broker.endpoint) as client:
            assert leased(client) == 100
            consumer.kill()
            killed = time.monotonic()
            wait_for(lambda: leased(client) == 0, 5, "the killed lease holder's batch to return")
            took = time.monotonic() - killed
    finally:
        consumer.kill()
        consumer.wait(5)
    print(f"\nlease holder silent 2.5 s (client timeout 1 s), then SIGKILLed: batch back after {took * 1000:.0f} ms")
    assert took <= 2.0 and queue.dequeue_many(100, timeout=5).tolist() == held
