"""Leased dequeues over real sockets against a started broker: ids, ack / nack / extend and their errors.

Each test uses its own container. A second client (its own socket, so its own identity on the
broker) comes from its own ClientPool.
"""

import time
import uuid

import numpy as np
import pytest

from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.errors import (FailedPreconditionError, InvalidArgumentError, NotFoundError, OutOfRangeError,
                                   PermissionDeniedError)
from zmqflow.common.clients.leases import Lease
from zmqflow.common.clients.queues import FIFOQueue, attach
from zmqflow.common.rpc.client import ClientPool, RpcClient
from zmqflow.common.wire.protocol import BrokerOps
from tests.support import wait_for

pytestmark = pytest.mark.service


@pytest.fixture
def container():
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def queue(broker, container):
    q = FIFOQueue(100, ["int32"], shapes=[[]], shared_name="work", container=container, broker=broker)
    q.enqueue_many([np.arange(10, dtype=np.int32)])
    return q


def other_client(queue, container, pool):
    """The same queue seen through another client socket (another consumer)."""
    return attach("work", container, queue.broker, pool)


def leased_count(queue):
    with BrokerClient(queue.broker) as client:
        return next(q["leased"] for q in client.list_queues() if q["handle"] == queue.handle)


def test_leased_batch_is_held_until_acked(queue):
    lease = queue.dequeue_many(4, timeout=5, lease=30)
    assert isinstance(lease, Lease) and lease.values.tolist() == [0, 1, 2, 3] and lease.seconds == 30
    assert queue.size() == 6 and leased_count(queue) == 4
    assert lease.ack() == {"lease": lease.id, "acked": 4}
    assert queue.size() == 6 and leased_count(queue) == 0
    assert queue.dequeue_many(6, timeout=5).tolist() == [4, 5, 6, 7, 8, 9]   # the plain API is unchanged


def test_context_manager_acks_on_success_and_nacks_on_error(queue):
    with queue.dequeue_many(3, timeout=5, lease=30) as batch:
        assert batch.tolist() == [0, 1, 2]
    assert queue.size() == 7 and leased_count(queue) == 0                      # acked: gone for good
    with pytest.raises(ZeroDivisionError):
        with queue.dequeue_up_to(3, timeout=5, lease=30) as batch:
            assert batch.tolist() == [3, 4, 5]
            1 / 0
    assert queue.size() == 7 and queue.dequeue(timeout=5) == 3                # nacked: back at the front


def test_single_dequeue_with_lease_and_nack(queue):
    lease = queue.dequeue(timeout=5, lease=30)
    assert int(lease.values) == 0
    assert lease.nack() == {"lease": lease.id, "returned": 1}
    assert queue.dequeue(timeout=5) == 0


def test_an_expired_lease_returns_its_elements_and_its_ack_says_so(queue):
    lease = queue.dequeue_many(5, timeout=5, lease=0.3)
    started = time.monotonic()
    wait_for(lambda: queue.size() == 10, 5, "the expired lease's elements to come back")
    print(f"\nlease of 0.3 s: elements back after {time.monotonic() - started:.2f} s")
    with pytest.raises(FailedPreconditionError, match=f"lease {lease.id} expired after 0.3 s: its 5 elements went "
                                                      "back to the queue"):
        lease.ack()
    assert queue.dequeue_many(10, timeout=5).tolist() == list(range(10))


def test_extend_keeps_a_lease_past_its_first_expiry(queue):
    lease = queue.dequeue_many(2, timeout=5, lease=0.4)
    assert lease.extend(30)["lease_s"] == 30 and lease.seconds == 30
    time.sleep(0.8)
    assert queue.size() == 8
    lease.ack()


def test_a_client_that_says_bye_gives_its_leases_back(queue, container):
    pool = ClientPool()
    other = other_client(queue, container, pool)
    other.dequeue_many(10, timeout=5, lease=60)
    assert queue.size() == 0
    pool.close_thread()                                                         # bye
    wait_for(lambda: queue.size() == 10, 5, "the leaving client's lease to come back")
    assert queue.dequeue_many(10, timeout=5).tolist() == list(range(10))


def test_returned_elements_wake_a_parked_dequeuer(queue, container):
    lease = queue.dequeue_many(10, timeout=5, lease=30)
    pool = ClientPool()
    try:
        parked = other_client(queue, container, pool).dequeue_many_async(10, timeout=10)
        assert not parked.wait(0.2)
        lease.nack()
        assert parked.wait(5) and parked.result().tolist() == list(range(10))
    finally:
        pool.close_thread()


def test_closed_queue_waits_for_leases_then_fails_out_of_range(queue, container):
    lease = queue.dequeue_many(10, timeout=5, lease=30)
    queue.close()
    pool = ClientPool()
    try:
        waiting = other_client(queue, container, pool).dequeue_async(timeout=10)
        assert not waiting.wait(0.3)                                           # they may come back
        lease.ack()
        with pytest.raises(OutOfRangeError, match="is closed and has insufficient elements"):
            waiting.result()
    finally:
        pool.close_thread()


def test_lease_metrics_count_leased_acked_and_returned(queue):
    with BrokerClient(queue.broker) as client:
        before = client.info()["leases"]
        queue.dequeue_many(3, timeout=5, lease=30).ack()
        queue.dequeue_many(2, timeout=5, lease=30).nack()
        after = client.info()["leases"]
    delta = {k: after[k] - before[k] for k in ("leases", "leased", "acked", "nacked")}
    assert delta == {"leases": 2, "leased": 5, "acked": 3, "nacked": 2}


# ------------------------------------------------ errors, each by its exact message


@pytest.mark.parametrize("bad", [0, -2, float("nan"), 3601, "30"])
def test_bad_lease_value_is_invalid_argument(queue, bad):
    with pytest.raises(InvalidArgumentError, match=r"lease must be a number of seconds in \(0, 3600\], got "):
        queue.dequeue_many(2, timeout=5, lease=bad)
    assert queue.size() == 10


def test_lease_on_an_enqueue_is_invalid_argument(queue):
    with RpcClient(queue.broker) as client:
        with pytest.raises(InvalidArgumentError, match="enqueue takes no 'lease' \\(it takes queue\\)"):
            client.call(BrokerOps.Enqueue.OP, {"queue": queue.handle, "lease": 5}, [np.int32(1)], timeout=5)


def test_bad_extend_is_invalid_argument(queue):
    lease = queue.dequeue(timeout=5, lease=30)
    with pytest.raises(InvalidArgumentError, match=r"extend's seconds must be a number of seconds in \(0, 3600\]"):
        lease.extend(-1)
    lease.ack()


def test_ack_of_an_unknown_lease_is_not_found(queue):
    with RpcClient(queue.broker) as client:
        with pytest.raises(NotFoundError, match=r"lease 987654321 is unknown \(never granted, or settled long ago\)"):
            client.call(BrokerOps.Ack.OP, {"lease": 987654321}, timeout=5)
        with pytest.raises(InvalidArgumentError, match="ack's lease must be an int, got '7'"):
            client.call(BrokerOps.Ack.OP, {"lease": "7"}, timeout=5)


def test_ack_twice_is_not_found_already_acknowledged(queue):
    lease = queue.dequeue_many(2, timeout=5, lease=30)
    lease.ack()
    with pytest.raises(NotFoundError, match=f"lease {lease.id} was already acknowledged \\(queue 'work'\\)"):
        lease.ack()
    with pytest.raises(NotFoundError, match=f"lease {lease.id} was already acknowledged"):
        lease.nack()


def test_ack_from_another_client_is_permission_denied(queue):
    lease = queue.dequeue_many(2, timeout=5, lease=30)
    with RpcClient(queue.broker) as stranger:
        with pytest.raises(PermissionDeniedError, match=f"lease {lease.id} belongs to another client"):
            stranger.call(BrokerOps.Ack.OP, {"lease": lease.id}, timeout=5)
    assert leased_count(queue) == 2
    lease.ack()


def test_lease_counters_are_exported_to_prometheus(processes):
    from tests.ops.helpers import metrics_url, scrape, value
    broker = processes.service("zmqflow.services.broker", ["--metrics-bind", "0"])
    q = FIFOQueue(10, ["int32"], shapes=[[]], shared_name="m", broker=broker.endpoint)
    q.enqueue_many([np.arange(6, dtype=np.int32)])
    q.dequeue_many(2, timeout=5, lease=30).ack()
    q.dequeue_many(3, timeout=5, lease=30).nack()
    held = q.dequeue(timeout=5, lease=30)
    samples = scrape(metrics_url(broker.endpoint))
    assert value(samples, "zmqflow_broker_leases_total") == 3
    assert value(samples, "zmqflow_broker_leased_elements_total") == 6
    assert value(samples, "zmqflow_broker_acked_elements_total") == 2
    assert value(samples, "zmqflow_broker_returned_elements_total", reason="nacked") == 3
    assert value(samples, "zmqflow_broker_open_leases") == 1
    assert value(samples, "zmqflow_broker_queue_leased", queue="m") == 1
    held.ack()


def test_leases_of_a_reset_container_are_forgotten(queue, container):
    lease = queue.dequeue_many(2, timeout=5, lease=30)
    with BrokerClient(queue.broker) as client:
        client.reset(container)
    with pytest.raises(NotFoundError, match=f"lease {lease.id} is gone: its queue was freed by a container reset"):
        lease.ack()


def test_a_client_silent_while_it_waits_is_swept_with_its_leases(queue):
    """The module's broker sweeps clients silent for 3 s while they hold parked requests; a client that
    submitted and never waited sends no pings, so it is swept, and its lease returns with it."""
    with RpcClient(queue.broker) as silent:
        silent.call(BrokerOps.DequeueMany.OP, {"queue": queue.handle, "n": 10, "lease": 60}, timeout=5)
        silent.submit(BrokerOps.Dequeue.OP, {"queue": queue.handle}, timeout=None)   # parked, never waited on
        assert leased_count(queue) == 10
        started = time.monotonic()
        wait_for(lambda: leased_count(queue) == 0, 8, "the silent client's lease to return with the sweep")
        print(f"\nsilent client swept, its lease back after {time.monotonic() - started:.1f} s (client timeout 3 s)")
        assert queue.size() == 10
