"""Leased dequeues in the queue domain and the LeaseBook (queues/leases.py), no sockets.

The server's part (ids in replies, ack from the wire, clients that vanish) is in
test_leased_dequeue.py; here the queue's rules: leased elements are held (bytes)
but not stored (size), come back where a withdrawn batch's would, wake dequeuers,
and keep a closed queue from answering OutOfRange while they may come back.
"""

import math

import numpy as np
import pytest

from zmqflow.common.errors import (FailedPreconditionError, InvalidArgumentError, NotFoundError, OutOfRangeError,
                                   PermissionDeniedError)
from zmqflow.services.broker.queues import QUEUE_CLASSES, QueueDeclaration, Ticket
from zmqflow.common.wire.protocol import MAX_LEASE_SECONDS, lease_seconds as check_lease_seconds
from zmqflow.services.broker.queues.leases import LeaseBook

pytestmark = pytest.mark.unit

ME, OTHER = b"consumer-a", b"consumer-b"


def make(kind="FIFOQueue", capacity=100, **kw):
    decl = QueueDeclaration(kind, capacity, ["int32"], [[]], **kw)
    decl.validate()
    return QUEUE_CLASSES[kind](decl, "q")


def fill(q, *values):
    t = Ticket("enqueue_many", [np.array(values, np.int32)])
    q.submit(t)
    assert t.done and t.error is None


def take(q, op="dequeue_many", n=None, lease=None, owner=ME):
    t = Ticket(op, [], n=n, owner=owner, lease=lease)
    t.tag = q.submit(t)
    return t


def leased(book, q, n, seconds=10.0, now=0.0, owner=ME, op="dequeue_many"):
    """A granted lease on n elements of q, as the server grants it when the dequeue completes."""
    t = take(q, op, n=n, lease=seconds, owner=owner)
    assert t.done and t.error is None, t.error
    return book.grant(q, owner, t.leased, seconds, now), t


def values(t):
    return t.result[0].tolist() if t.op != "dequeue" else [int(t.result[0])]


def test_leased_elements_are_held_not_stored_until_acked():
    q, book = make(), LeaseBook()
    fill(q, 1, 2, 3, 4, 5)
    before = q.held_bytes
    lease, t = leased(book, q, 3)
    assert values(t) == [1, 2, 3]
    assert q.size() == 2 and q.describe()["leased"] == 3 and q.held_bytes == before  # still charged
    book.ack(lease.id, ME)
    assert q.describe()["leased"] == 0 and q.held_bytes == before * 2 // 5
    assert book.counts["leased"] == 3 and book.counts["acked"] == 3


def test_fifo_nack_returns_the_batch_to_the_front_in_order():
    q, book = make(), LeaseBook()
    fill(q, 1, 2, 3, 4, 5)
    lease, _ = leased(book, q, 3)
    book.nack(lease.id, ME)
    assert q.size() == 5 and values(take(q, n=5)) == [1, 2, 3, 4, 5]
    assert book.counts["nacked"] == 3


def test_padding_fifo_returns_to_the_front_too():
    q, book = make("PaddingFIFOQueue"), LeaseBook()
    fill(q, 7, 8, 9)
    lease, _ = leased(book, q, 2, op="dequeue_up_to")
    book.expire(now=lease.expires)
    assert values(take(q, n=3)) == [7, 8, 9]


def test_shuffle_queue_gets_every_element_back():
    q, book = make("RandomShuffleQueue", min_after_dequeue=0, seed=3), LeaseBook()
    fill(q, *range(10))
    lease, t = leased(book, q, 4)
    book.nack(lease.id, ME)
    assert q.size() == 10 and sorted(values(take(q, n=10))) == list(range(10))


def test_returned_elements_wake_a_parked_dequeuer():
    q, book = make(), LeaseBook()
    fill(q, 1, 2)
    lease, _ = leased(book, q, 2)
    waiting = take(q, n=2, owner=OTHER)
    assert not waiting.done
    done = book.nack(lease.id, ME)[1]
    assert done == [waiting] and values(waiting) == [1, 2]


def test_a_single_leased_dequeue_comes_back_on_expiry():
    q, book = make(), LeaseBook()
    fill(q, 4, 5)
    lease, t = leased(book, q, None, seconds=0.5, now=100.0, op="dequeue")
    assert values(t) == [4] and q.size() == 1
    assert book.expire(100.4) == [] and q.size() == 1          # not yet
    assert book.next_expiry == 100.5
    book.expire(100.5)
    assert q.size() == 2 and values(take(q, n=2)) == [4, 5] and book.counts["expired"] == 1
    assert book.next_expiry is None


def test_extend_moves_the_expiry():
    q, book = make(), LeaseBook()
    fill(q, 1)
    lease, _ = leased(book, q, 1, seconds=1.0, now=0.0)
    book.extend(lease.id, ME, 5.0, now=0.8)
    book.expire(2.0)
    assert q.size() == 0 and book.next_expiry == 5.8
    book.ack(lease.id, ME)
    assert book.next_expiry is None and len(book) == 0


def test_owner_gone_gives_back_only_its_leases():
    q, book = make(), LeaseBook()
    fill(q, 1, 2, 3, 4)
    mine, _ = leased(book, q, 2)
    theirs, _ = leased(book, q, 2, owner=OTHER)
    assert book.holds(ME) and book.holds(OTHER)
    book.give_back_owner(ME)
    assert not book.holds(ME) and q.size() == 2 and book.outstanding() == 2
    assert book.counts["client_gone"] == 2


# ------------------------------------------------ the closed-queue rule


def test_closed_queue_with_only_leased_elements_waits_instead_of_out_of_range():
    q, book = make(), LeaseBook()
    fill(q, 1, 2)
    lease, _ = leased(book, q, 2)
    q.submit(Ticket("close"))
    single, batch, up_to = take(q, "dequeue", owner=OTHER), take(q, n=2, owner=OTHER), take(q, "dequeue_up_to", n=5)
    assert not (single.done or batch.done or up_to.done)      # they may come back
    book.nack(lease.id, ME)                                    # they did: served in arrival order
    assert values(single) == [1] and batch.done and isinstance(batch.error, OutOfRangeError)
    assert values(up_to) == [2]


def test_closed_queue_fails_waiters_once_the_lease_is_acked():
    q, book = make(), LeaseBook()
    fill(q, 1, 2)
    lease, _ = leased(book, q, 2)
    q.submit(Ticket("close"))
    waiting = take(q, "dequeue", owner=OTHER)
    assert not waiting.done
    done = book.ack(lease.id, ME)[1]
    assert done == [waiting] and isinstance(waiting.error, OutOfRangeError)


def test_closed_queue_refuses_at_once_what_even_returned_leases_cannot_fill():
    q, book = make(), LeaseBook()
    fill(q, 1, 2, 3)
    leased(book, q, 2)
    q.submit(Ticket("close"))
    many = take(q, n=5)                       # 1 stored + 2 leased < 5: can never be served
    assert many.done and isinstance(many.error, OutOfRangeError)
    up_to = take(q, "dequeue_up_to", n=5)      # up_to returns what is stored, does not wait for leases
    assert values(up_to) == [3]


# ------------------------------------------------ errors


@pytest.mark.parametrize("bad", [0, -1, float("nan"), math.inf, MAX_LEASE_SECONDS + 1, "10", True, None])
def test_bad_lease_seconds_are_invalid_argument(bad):
    with pytest.raises(InvalidArgumentError, match=r"lease must be a number of seconds in \(0, 3600\]"):
        check_lease_seconds(bad)


def test_ack_of_an_unknown_lease_is_not_found():
    with pytest.raises(NotFoundError, match="lease 99 is unknown"):
        LeaseBook().ack(99, ME)


def test_ack_twice_is_not_found_already_acknowledged():
    q, book = make(), LeaseBook()
    fill(q, 1)
    lease, _ = leased(book, q, 1)
    book.ack(lease.id, ME)
    with pytest.raises(NotFoundError, match=f"lease {lease.id} was already acknowledged \\(queue 'q'\\)"):
        book.ack(lease.id, ME)


def test_ack_after_expiry_is_failed_precondition_saying_the_elements_went_back():
    q, book = make(), LeaseBook()
    fill(q, 1, 2)
    lease, _ = leased(book, q, 2, seconds=0.5)
    book.expire(1.0)
    with pytest.raises(FailedPreconditionError, match=f"lease {lease.id} expired after 0.5 s: its 2 elements went "
                                                      "back to the queue"):
        book.ack(lease.id, ME)


def test_settling_another_clients_lease_is_permission_denied():
    q, book = make(), LeaseBook()
    fill(q, 1)
    lease, _ = leased(book, q, 1)
    for settle in (book.ack, book.nack):
        with pytest.raises(PermissionDeniedError, match=f"lease {lease.id} belongs to another client"):
            settle(lease.id, OTHER)
    assert q.describe()["leased"] == 1         # untouched


def test_leases_of_a_freed_queue_are_forgotten():
    q, book = make(), LeaseBook()
    fill(q, 1)
    lease, _ = leased(book, q, 1)
    q.free()
    book.forget_freed_queues()
    assert len(book) == 0
    with pytest.raises(NotFoundError, match="its queue was freed by a container reset"):
        book.ack(lease.id, ME)


def test_settled_leases_leave_the_expiry_heap_long_before_they_would_have_expired():
    """Each lease's expiry entry left only when its time came: hour-long leases acked at once kept an entry
    each for an hour. Past twice the open leases, the heap is rebuilt with the live ones."""
    class Queue:
        freed, name = False, "q"

        def settle(self, elements):
            return []

    book, queue = LeaseBook(), Queue()
    keep = book.grant(queue, b"a", [1], 3600.0, 0.0)
    for i in range(10_000):
        book.ack(book.grant(queue, b"a", [i], 3600.0, float(i)).id, b"a")
    assert len(book) == 1 and len(book._expiries) <= 1024
    assert book.next_expiry == keep.expires
