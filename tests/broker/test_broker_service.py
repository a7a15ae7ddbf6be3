"""The queue semantics again, over real sockets against a started broker process.

Each test uses its own container so tests never see each other's queues.
Blocking is observed with `*_async` futures and the broker's queue listing.
"""

import threading
import uuid

import numpy as np
import pytest

from zmqflow.common.clients import queues
from zmqflow.common.errors import (CancelledError, DeadlineExceededError, InvalidArgumentError, NotFoundError,
                           OutOfRangeError)
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.clients.queues import FIFOQueue, PaddingFIFOQueue, RandomShuffleQueue
from tests.support import wait_for

pytestmark = pytest.mark.service


@pytest.fixture
def container():
    return f"t-{uuid.uuid4().hex[:8]}"


def waiting(broker, q, timeout=5.0, enq=None, deq=None):
    """The broker's listing of q once it reports the given numbers of waiting requests (bounded)."""
    with RpcClient(broker) as client:
        def reached():
            rows = [r for r in client.call("list_queues", timeout=2)[0]["queues"] if r["handle"] == q.handle]
            row = rows[0] if rows else {}
            enqueues, dequeues = row.get("waiting_enqueues"), row.get("waiting_dequeues")
            if (enq is None or enqueues == enq) and (deq is None or dequeues == deq):
                return row
        return wait_for(reached, timeout, f"queue {q.handle} to have {enq} waiting enqueues, {deq} waiting dequeues",
                        interval=0.01)


def test_enqueue_dequeue_round_trip_with_names(broker, container):
    q = FIFOQueue(10, ["float32", "int32"], shapes=[[2], []], names=["x", "y"], shared_name="q",
                  container=container, broker=broker)
    q.enqueue({"x": np.array([1, 2], np.float32), "y": 3})
    out = q.dequeue(timeout=2)
    assert set(out) == {"x", "y"} and out["y"] == 3 and out["x"].tolist() == [1.0, 2.0]
    with pytest.raises(InvalidArgumentError):
        q.enqueue([np.zeros(2, np.float32), 1])  # positional values on a named queue


def test_dtype_mismatch_is_invalid_argument(broker, container):
    q = FIFOQueue(10, "int32", shapes=[[]], container=container, broker=broker)
    with pytest.raises(InvalidArgumentError):
        q.enqueue(np.int64(1))
    assert q.size() == 0


def test_attach_by_shared_name_and_incompatible_declaration(broker, container):
    a = FIFOQueue(10, "float32", shared_name="shared", container=container, broker=broker)
    b = FIFOQueue(10, "float32", shared_name="shared", container=container, broker=broker)
    assert a.handle == b.handle
    with pytest.raises(InvalidArgumentError, match="capacity"):
        FIFOQueue(15, "float32", shared_name="shared", container=container, broker=broker)
    with pytest.raises(InvalidArgumentError):
        PaddingFIFOQueue(10, "float32", shapes=[[None]], shared_name="shared", container=container, broker=broker)
    other = FIFOQueue(10, "float32", shared_name="shared", container=container + "-other", broker=broker)
    assert other.handle != a.handle


def test_blocked_dequeue_served_when_element_arrives(broker, container):
    q = FIFOQueue(10, "int32", shapes=[[]], container=container, broker=broker)
    first = q.dequeue_async(timeout=10)
    second = q.dequeue_async(timeout=10)
    waiting(broker, q, deq=2)
    q.enqueue_many([np.array([1, 2], np.int32)])
    assert (first.result(), second.result()) == (1, 2)  # arrival order


def test_dequeue_many_absorbs_ahead_of_later_dequeue(broker, container):
    q = FIFOQueue(10, "int32", shapes=[[]], container=container, broker=broker)
    many = q.dequeue_many_async(3, timeout=10)
    single = q.dequeue_async(timeout=10)
    waiting(broker, q, deq=2)
    q.enqueue_many([np.arange(4, dtype=np.int32)])
    assert many.result().tolist() == [0, 1, 2]
    assert single.result() == 3


def test_blocked_enqueue_then_close_waits_behind_it(broker, container):
    q = FIFOQueue(1, "int32", shapes=[[]], container=container, broker=broker)
    q.enqueue(1)
    blocked = q.enqueue_async(2, timeout=10)
    closing = q.close_async(timeout=10)
    waiting(broker, q, enq=2)
    assert not q.is_closed()
    assert q.dequeue(timeout=2) == 1
    blocked.result()
    closing.result()
    assert q.is_closed()
    assert q.dequeue(timeout=2) == 2
    with pytest.raises(OutOfRangeError):
        q.dequeue(timeout=2)


def test_cancelling_close_fails_pending_enqueues(broker, container):
    q = FIFOQueue(1, "int32", shapes=[[]], container=container, broker=broker)
    q.enqueue(1)
    blocked = q.enqueue_async(2, timeout=10)
    waiting(broker, q, enq=1)
    q.close(cancel_pending_enqueues=True)
    with pytest.raises(CancelledError):
        blocked.result()
    with pytest.raises(CancelledError):
        q.enqueue(3)
    with pytest.raises(CancelledError):
        q.close()
    q.close(cancel_pending_enqueues=True)


def test_dequeue_up_to_after_close_returns_the_rest(broker, container):
    q = FIFOQueue(10, "int32", shapes=[[]], container=container, broker=broker)
    pending = q.dequeue_up_to_async(5, timeout=10)
    q.enqueue_many([np.array([1, 2], np.int32)])
    waiting(broker, q, deq=1)
    q.close()
    assert pending.result().tolist() == [1, 2]
    with pytest.raises(OutOfRangeError):
        q.dequeue_up_to(5, timeout=2)


def test_dequeue_many_deadline_restores_held_elements(broker, container):
    q = FIFOQueue(10, "int32", shapes=[[]], container=container, broker=broker)
    q.enqueue_many([np.array([1, 2], np.int32)])
    with pytest.raises(DeadlineExceededError):
        q.dequeue_many(3, timeout=0.2)
    assert q.size() == 2  # the broker fixes TF's data loss
    assert q.dequeue_many(2, timeout=2).tolist() == [1, 2]


def test_deadline_on_close_withdraws_it(broker, container):
    q = FIFOQueue(1, "int32", shapes=[[]], container=container, broker=broker)
    q.enqueue(1)
    blocked = q.enqueue_async(2, timeout=10)
    with pytest.raises(DeadlineExceededError):
        q.close(timeout=0.2)
    assert not q.is_closed()
    assert q.dequeue(timeout=2) == 1
    blocked.result()


def test_client_going_away_cancels_its_requests_and_restores_held(broker, container):
    q = FIFOQueue(10, "int32", shapes=[[]], shared_name="q", container=container, broker=broker)
    q.enqueue(5)
    client = RpcClient(broker)
    client.submit("dequeue_many", {"queue": q.handle, "n": 2}, timeout=30)  # absorbs the 5, then waits
    waiting(broker, q, deq=1)
    client.close()  # says bye
    waiting(broker, q, deq=0)
    assert q.dequeue(timeout=2) == 5


@pytest.mark.faults
def test_killed_client_is_detected_by_lease(broker, container):
    q = FIFOQueue(10, "int32", shapes=[[]], container=container, broker=broker)
    q.enqueue(5)
    client = RpcClient(broker)
    client.submit("dequeue_many", {"queue": q.handle, "n": 2}, timeout=60)
    waiting(broker, q, deq=1)
    client.socket.close(0)  # vanishes without a word, like kill -9
    row = waiting(broker, q, deq=0, timeout=10)  # broker started with --client-timeout-secs 3
    assert row["size"] == 1


def test_reset_container_cancels_pending_and_frees_queues(broker, container):
    q = FIFOQueue(10, "int32", shapes=[[]], shared_name="q", container=container, broker=broker)
    pending = q.dequeue_async(timeout=10)
    waiting(broker, q, deq=1)
    queues.reset(container, broker=broker)
    with pytest.raises(CancelledError):
        pending.result()
    with pytest.raises(NotFoundError):
        q.size()
    again = FIFOQueue(10, "int32", shapes=[[]], shared_name="q", container=container, broker=broker)
    assert again.handle != q.handle and again.size() == 0


def test_padding_queue_pads_each_batch(broker, container):
    q = PaddingFIFOQueue(10, ["int32", "string"], shapes=[[None], []], container=container, broker=broker)
    q.enqueue([np.array([1, 2, 3], np.int32), b"abc"])
    q.enqueue([np.array([4], np.int32), "d"])
    x, s = q.dequeue_many(2, timeout=2)
    assert x.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert s.tolist() == [b"abc", b"d"]


def test_random_shuffle_queue_delivers_each_element_once(broker, container):
    q = RandomShuffleQueue(100, 10, "int32", shapes=[[]], seed=3, container=container, broker=broker)
    q.enqueue_many([np.arange(50, dtype=np.int32)])
    got = list(q.dequeue_many(40, timeout=2))
    assert q.size() == 10
    with pytest.raises(DeadlineExceededError):
        q.dequeue(timeout=0.1)  # min_after_dequeue holds while open
    q.close()
    got += list(q.dequeue_up_to(100, timeout=2))
    assert sorted(got) == list(range(50)) and got != list(range(50))


def test_concurrent_producers_and_consumers_conserve_elements(broker, container):
    q = FIFOQueue(8, "int64", shapes=[[]], shared_name="q", container=container, broker=broker)
    producers, consumers, per_producer = 3, 3, 300
    received, errors = [[] for _ in range(consumers)], []

    def produce(p):
        try:
            for i in range(0, per_producer, 10):
                q.enqueue_many([np.arange(p * per_producer + i, p * per_producer + i + 10, dtype=np.int64)], timeout=20)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    def consume(c):
        try:
            while True:
                received[c].extend(q.dequeue_up_to(7, timeout=20).tolist())
        except OutOfRangeError:
            pass
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    threads += [threading.Thread(target=consume, args=(c,)) for c in range(consumers)]
    for t in threads:
        t.start()
    for t in threads[:producers]:
        t.join(30)
    q.close()
    for t in threads[producers:]:
        t.join(30)
    assert not errors and not any(t.is_alive() for t in threads)
    everything = sorted(x for r in received for x in r)
    assert everything == list(range(producers * per_producer))
    for r in received:  # each producer's elements stay in order for each consumer
        for p in range(producers):
            mine = [x for x in r if p * per_producer <= x < (p + 1) * per_producer]
            assert mine == sorted(mine)


def test_attach_by_name_learns_the_declaration(broker, container):
    q = RandomShuffleQueue(50, 5, ["float32", "int32"], shapes=[[3], []], names=["x", "y"], shared_name="data",
                           container=container, broker=broker)
    q.enqueue({"x": np.ones(3, np.float32), "y": 7})
    attached = queues.attach("data", container=container, broker=broker)
    assert type(attached) is RandomShuffleQueue and attached.handle == q.handle
    assert attached.names == ["x", "y"] and attached.shapes == [[3], []]
    with pytest.raises(NotFoundError):
        queues.attach("missing", container=container, broker=broker, timeout=0.1)
