"""A plain dequeue whose answer cannot be delivered gives its elements back (QueueBase.take_back), no sockets:
they return where a withdrawn batch's would (§5), are held (bytes) again, and complete waiting dequeues."""

import pytest

from zmqflow.services.broker.queues import Ticket
from tests.broker.test_leases import fill, make

pytestmark = pytest.mark.unit


def take(q, op="dequeue_many", n=None):
    t = Ticket(op, [], n=n)
    q.submit(t)
    return t


@pytest.mark.parametrize("op, n", [("dequeue_many", 3), ("dequeue_up_to", 3), ("dequeue", None)])
def test_a_fifo_gets_the_elements_back_at_its_front_in_order_and_holds_their_bytes_again(op, n):
    q = make()
    fill(q, 1, 2, 3, 4, 5)
    before = q.held_bytes
    t = take(q, op, n)
    assert t.done and len(t.handed) == (n or 1) and q.held_bytes < before
    assert q.take_back(t) == [] and t.handed is None
    assert q.size() == 5 and q.held_bytes == before
    assert take(q, "dequeue_many", 5).result[0].tolist() == [1, 2, 3, 4, 5]


def test_taken_back_elements_complete_a_waiting_dequeue():
    q = make()
    fill(q, 1, 2)
    first = take(q, "dequeue_many", 2)
    waiting = take(q, "dequeue_many", 2)
    assert not waiting.done
    assert q.take_back(first) == [waiting] and waiting.result[0].tolist() == [1, 2]


def test_a_random_shuffle_queue_keeps_every_element():
    q = make("RandomShuffleQueue", min_after_dequeue=0, seed=1)
    fill(q, *range(10))
    t = take(q, "dequeue_many", 4)
    q.take_back(t)
    assert sorted(take(q, "dequeue_many", 10).result[0].tolist()) == list(range(10))


def test_a_leased_or_failed_dequeue_has_nothing_to_take_back():
    q = make()
    fill(q, 1)
    leased = Ticket("dequeue", [], lease=5.0)
    q.submit(leased)
    assert leased.leased and leased.handed is None and q.take_back(leased) == []
    failed = take(q, "dequeue_many", 0)
    assert failed.handed is None and q.take_back(failed) == []
