"""The broker's queue and byte limits (services/broker/queues/quota.py), no sockets.

In the style of TensorFlow's queue tests: each edge case is a named test with
the exact error it expects. Bytes are charged when an enqueue is accepted and
released when they leave, so after any sequence of operations the counters
equal what the queues really hold.
"""

import random

import numpy as np
import pytest

from zmqflow.common.errors import CancelledError, DeadlineExceededError, ResourceExhaustedError
from zmqflow.services.broker.queues import QueueDeclaration, QueueRegistry, Ticket
from zmqflow.services.broker.queues.quota import BrokerLimits, element_overhead

pytestmark = pytest.mark.unit

OVERHEAD = element_overhead(1)   # the element's tuple and array object, charged with its data
ROW = 100 * 4 + OVERHEAD  # one int32[100] element


def registry(**limits):
    return QueueRegistry(BrokerLimits(**limits))


def open_queue(r, name="q", container="", capacity=-1, kind="FIFOQueue", dtypes=("int32",), shapes=([100],), **kw):
    decl = QueueDeclaration(kind, capacity, list(dtypes), None if shapes is None else [list(s) for s in shapes],
                            shared_name=name, container=container, **kw)
    return r.get(r.open(decl)[0])


def go(q, op, *components, n=None, cancel=False):
    t = Ticket(op, list(components), n=n, cancel_pending_enqueues=cancel)
    t.tag = q.submit(t)
    return t


def row(v=0):
    return np.full(100, v, np.int32)


def rows(n):
    return np.zeros((n, 100), np.int32)


def held(r):
    return r.quota.total_bytes


# ------------------------------------------------ bytes per container and in all


def test_enqueue_over_max_container_bytes_is_resource_exhausted_naming_the_limit():
    r = registry(max_container_bytes=2 * ROW)
    q = open_queue(r)
    go(q, "enqueue", row()), go(q, "enqueue", row())
    with pytest.raises(ResourceExhaustedError, match=rf"max_container_bytes limit \({2 * ROW}\)") as e:
        go(q, "enqueue", row())
    assert f"{ROW} more bytes" in str(e.value) and f"hold {3 * ROW} bytes" in str(e.value)
    assert q.size() == 2 and held(r) == 2 * ROW


def test_enqueue_over_max_total_bytes_counts_every_container():
    r = registry(max_total_bytes=3 * ROW)
    a, b = open_queue(r, container="a"), open_queue(r, container="b")
    go(a, "enqueue", row()), go(a, "enqueue", row()), go(b, "enqueue", row())
    with pytest.raises(ResourceExhaustedError, match=rf"max_total_bytes limit \({3 * ROW}\)"):
        go(b, "enqueue", row())
    assert r.quota.container_bytes == {"a": 2 * ROW, "b": ROW}


def test_containers_have_separate_byte_budgets():
    r = registry(max_container_bytes=ROW)
    go(open_queue(r, container="a"), "enqueue", row())
    go(open_queue(r, container="b"), "enqueue", row())
    assert held(r) == 2 * ROW


def test_enqueue_many_over_the_limit_is_refused_whole():
    r = registry(max_container_bytes=5 * ROW)
    q = open_queue(r)
    with pytest.raises(ResourceExhaustedError, match=f"{6 * ROW} more bytes"):
        go(q, "enqueue_many", rows(6))
    assert q.size() == 0 and held(r) == 0
    go(q, "enqueue_many", rows(5))
    assert q.size() == 5 and held(r) == 5 * ROW


def test_dequeue_releases_bytes_so_the_next_enqueue_fits():
    r = registry(max_container_bytes=ROW)
    q = open_queue(r)
    go(q, "enqueue", row(1))
    go(q, "dequeue")
    assert held(r) == 0
    assert go(q, "enqueue", row(2)).error is None


def test_dequeue_many_releases_the_batch():
    r = registry(max_container_bytes=4 * ROW)
    q = open_queue(r)
    go(q, "enqueue_many", rows(4))
    go(q, "dequeue_many", n=3)
    assert held(r) == ROW and q.held_bytes == ROW


def test_blocked_enqueue_counts_while_it_waits_and_its_deadline_releases_it():
    r = registry(max_container_bytes=2 * ROW)
    q = open_queue(r, capacity=1)
    go(q, "enqueue", row())
    waiting = go(q, "enqueue", row())
    assert not waiting.done and held(r) == 2 * ROW  # its data is in the broker too
    with pytest.raises(ResourceExhaustedError, match="max_container_bytes"):
        go(q, "enqueue", row())
    q.cancel(waiting, DeadlineExceededError("Timed out waiting for notification"))
    assert isinstance(waiting.error, DeadlineExceededError) and held(r) == ROW


def test_partly_inserted_enqueue_many_withdrawn_releases_only_the_rest():
    r = registry()
    q = open_queue(r, capacity=3)
    t = go(q, "enqueue_many", rows(5))
    assert not t.done and q.size() == 3 and held(r) == 5 * ROW
    q.cancel(t, CancelledError("cancelled"))
    assert held(r) == 3 * ROW == q.held_bytes  # the 3 inserted stay


def test_enqueue_on_a_closed_queue_holds_nothing():
    r = registry()
    q = open_queue(r)
    go(q, "close")
    assert isinstance(go(q, "enqueue", row()).error, CancelledError)
    assert isinstance(go(q, "enqueue_many", rows(3)).error, CancelledError)
    assert held(r) == 0


def test_close_cancelling_pending_enqueues_releases_them():
    r = registry()
    q = open_queue(r, capacity=1)
    go(q, "enqueue", row())
    go(q, "enqueue_many", rows(4))
    assert held(r) == 5 * ROW
    go(q, "close", cancel=True)
    assert held(r) == ROW


def test_container_reset_releases_its_bytes_and_queue_count():
    r = registry(max_queues_per_container=1)
    q = open_queue(r, container="c", capacity=2)
    go(q, "enqueue_many", rows(4))  # 2 stored, 2 waiting
    go(open_queue(r, container="d"), "enqueue", row())
    r.reset("c")
    assert r.quota.container_bytes["c"] == 0 and held(r) == ROW
    open_queue(r, "again", container="c")  # the count went down too


def test_pending_dequeue_many_holding_elements_keeps_them_counted():
    r = registry()
    q = open_queue(r)
    go(q, "enqueue", row())
    d = go(q, "dequeue_many", n=3)
    assert not d.done and held(r) == ROW
    q.cancel(d, CancelledError("cancelled"))
    assert q.size() == 1 and held(r) == ROW


def test_string_components_count_their_bytes_not_pointers():
    r = registry(max_container_bytes=1000 + 2 * OVERHEAD)
    q = open_queue(r, dtypes=("string",), shapes=([],))
    go(q, "enqueue", np.array(b"x" * 500, dtype=object))
    with pytest.raises(ResourceExhaustedError, match="max_container_bytes"):
        go(q, "enqueue", np.array(b"y" * 500, dtype=object))
    go(q, "dequeue")
    assert held(r) == 0


def test_padding_queue_counts_each_element_by_its_own_shape():
    r = registry(max_container_bytes=100 + 2 * OVERHEAD)
    q = open_queue(r, kind="PaddingFIFOQueue", shapes=([None],))
    go(q, "enqueue", np.zeros(5, np.int32)), go(q, "enqueue", np.zeros(10, np.int32))
    assert held(r) == 60 + 2 * OVERHEAD
    with pytest.raises(ResourceExhaustedError):
        go(q, "enqueue", np.zeros(11, np.int32))
    go(q, "dequeue_many", n=2)  # padded to 2x10 on the way out; what was held is released
    assert held(r) == 0


def test_random_shuffle_queue_releases_what_it_hands_out():
    """A shuffle queue of one fixed shape keeps its rows in its own arrays (queues/slab.py): a row costs its data
    alone, no tuple or array object of its own."""
    r = registry()
    q = open_queue(r, kind="RandomShuffleQueue", capacity=10, min_after_dequeue=2, seed=1)
    go(q, "enqueue_many", rows(6))
    assert held(r) == 6 * (ROW - OVERHEAD)
    go(q, "dequeue_many", n=4)
    assert held(r) == 2 * (ROW - OVERHEAD)
    go(q, "close")
    go(q, "dequeue")  # closed: min_after_dequeue no longer holds the last two
    assert held(r) == ROW - OVERHEAD


def test_random_shuffle_queue_of_strings_charges_each_element_its_objects():
    r = registry()
    q = open_queue(r, kind="RandomShuffleQueue", capacity=10, dtypes=("string",), shapes=([],))
    go(q, "enqueue_many", np.array([b"abc", b"de"], object))
    assert held(r) == 2 * 8 + 5 + 2 * OVERHEAD
    go(q, "dequeue_many", n=2)
    assert held(r) == 0


def truth(queues, pending):
    """Bytes really in the broker: stored elements, rows pending enqueues still bring, rows held by dequeues."""
    stored = sum(q.size() for q in queues) * ROW
    waiting = sum((1 if t.op == "enqueue" else t._batch - t._next) * ROW for _, t in pending
                  if not t.done and t.op.startswith("enqueue"))
    taken = sum(len(t._held or ()) * ROW for _, t in pending if not t.done and t.op.startswith("dequeue"))
    return stored + waiting + taken


def test_counters_match_the_queues_after_random_operations():
    r, rng = registry(max_container_bytes=40 * ROW), random.Random(7)
    queues = [open_queue(r, f"q{i}", container=f"c{i % 2}", capacity=rng.choice([-1, 5])) for i in range(4)]
    pending = []
    for _ in range(400):
        q = rng.choice(queues)
        op = rng.choice(["enqueue", "enqueue_many", "dequeue", "dequeue_many", "cancel"])
        try:
            if op == "enqueue":
                pending.append((q, go(q, "enqueue", row())))
            elif op == "enqueue_many":
                pending.append((q, go(q, "enqueue_many", rows(rng.randint(0, 7)))))
            elif op == "cancel" and pending:
                q, t = pending.pop(rng.randrange(len(pending)))
                q.cancel(t, CancelledError("cancelled"))
            elif op != "cancel":
                pending.append((q, go(q, op, n=None if op == "dequeue" else rng.randint(1, 4))))
        except ResourceExhaustedError:
            pass
        assert held(r) == sum(x.held_bytes for x in queues) == truth(queues, pending)
        assert max(r.quota.container_bytes.values(), default=0) <= 40 * ROW
    for q in queues:
        go(q, "close", cancel=True)
        go(q, "dequeue_up_to", n=1000)
    for q, t in pending:
        q.cancel(t, CancelledError("cancelled"))
    assert held(r) == 0 and set(r.quota.container_bytes.values()) == {0}


# ------------------------------------------------ queue count and capacity


def test_max_queues_refuses_a_new_queue_naming_the_limit():
    r = registry(max_queues=2)
    open_queue(r, "a"), open_queue(r, "b", container="x")
    with pytest.raises(ResourceExhaustedError, match=r"broker holds 2 queues, the max_queues limit \(2\)"):
        open_queue(r, "c")


def test_max_queues_per_container_refuses_only_that_container():
    r = registry(max_queues_per_container=1)
    open_queue(r, "a", container="x")
    with pytest.raises(ResourceExhaustedError, match=r"max_queues_per_container limit \(1\)"):
        open_queue(r, "b", container="x")
    open_queue(r, "b", container="y")


def test_attaching_to_an_existing_queue_is_not_a_new_queue():
    r = registry(max_queues=1)
    assert open_queue(r, "a") is open_queue(r, "a")


def test_private_queues_count_too():
    r = registry(max_queues=1)
    open_queue(r, "")
    with pytest.raises(ResourceExhaustedError, match="max_queues"):
        open_queue(r, "")


def test_max_queue_capacity_refuses_a_larger_capacity():
    r = registry(max_queue_capacity=100)
    open_queue(r, "ok", capacity=100)
    with pytest.raises(ResourceExhaustedError, match=r"capacity 101: over the max_queue_capacity limit \(100\)"):
        open_queue(r, "big", capacity=101)


def test_max_queue_capacity_refuses_an_unbounded_queue():
    r = registry(max_queue_capacity=100)
    with pytest.raises(ResourceExhaustedError, match="unbounded capacity: over the max_queue_capacity"):
        open_queue(r, "big", capacity=-1)


def test_no_limits_by_default():
    r = QueueRegistry()
    for i in range(50):
        go(open_queue(r, f"q{i}"), "enqueue_many", rows(10))
    assert held(r) == 500 * ROW and len(r) == 50
