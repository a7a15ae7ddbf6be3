"""A FIFO batch that is one slice of one enqueue_many leaves without a copy, and stays correct otherwise."""

import numpy as np
import pytest

from zmqflow.services.broker.queues import FIFOQueue, QueueDeclaration, Ticket
from zmqflow.services.broker.queues.base import consecutive_rows

pytestmark = pytest.mark.unit


def fifo(capacity=100):
    return FIFOQueue(QueueDeclaration("FIFOQueue", capacity, ["float32", "int32"], [[3], []]), "q")


def run(q, op, **kw):
    t = Ticket(op, **kw)
    q.submit(t)
    assert t.done and t.error is None, t.error
    return t.result


def test_whole_batch_is_a_view_of_the_enqueued_message():
    q = fifo()
    x, y = np.arange(30, dtype=np.float32).reshape(10, 3), np.arange(10, dtype=np.int32)
    x.flags.writeable = y.flags.writeable = False  # as arrays decoded from the wire are
    run(q, "enqueue_many", components=[x, y])
    bx, by = run(q, "dequeue_many", n=4)
    assert np.shares_memory(bx, x) and np.shares_memory(by, y)
    assert bx.tolist() == x[:4].tolist() and by.tolist() == [0, 1, 2, 3]


def test_batch_spanning_two_messages_is_copied_correctly():
    q = fifo()
    a, b = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    run(q, "enqueue_many", components=[a, np.array([0, 1], np.int32)])
    run(q, "enqueue_many", components=[b, np.array([2, 3], np.int32)])
    bx, by = run(q, "dequeue_many", n=4)
    assert not np.shares_memory(bx, a) and bx.tolist() == [[0] * 3, [0] * 3, [1] * 3, [1] * 3]
    assert by.tolist() == [0, 1, 2, 3]


def test_rows_with_a_gap_or_from_two_buffers_are_not_a_slice():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    rows = list(x)
    assert consecutive_rows([rows[0], rows[1], rows[3]]) is None
    assert consecutive_rows([rows[0], list(x.copy())[1]]) is None
    assert consecutive_rows(rows[1:3]).tolist() == x[1:3].tolist()


def test_a_whole_enqueue_many_leaves_as_a_read_only_view_of_it():
    q = fifo()
    x, y = np.arange(30, dtype=np.float32).reshape(10, 3), np.arange(10, dtype=np.int32)
    run(q, "enqueue_many", components=[x, y])
    bx, by = run(q, "dequeue_many", n=10)
    assert np.shares_memory(bx, x) and np.shares_memory(by, y)
    assert bx.tolist() == x.tolist() and by.tolist() == y.tolist()
    assert not bx.flags.writeable and not by.flags.writeable
    assert x.flags.writeable  # the message's own arrays are left as they were


def test_a_batch_after_an_element_was_given_back_is_still_answered_right():
    """The first element taken alone, then given back in front (a withdrawn or undelivered answer)."""
    q = fifo()
    x, y = np.arange(12, dtype=np.float32).reshape(4, 3), np.arange(4, dtype=np.int32)
    run(q, "enqueue_many", components=[x, y])
    t = Ticket("dequeue")
    q.submit(t)
    assert q.take_back(t) == []
    bx, by = run(q, "dequeue_many", n=4)
    assert bx.tolist() == x.tolist() and by.tolist() == [0, 1, 2, 3]


def test_a_batch_with_a_gap_in_one_message_and_rows_of_another_is_gathered_right():
    """A message's first row given back in front of its third and of another message's rows: no view."""
    q = fifo()
    a, b = np.zeros((3, 3), np.float32), np.ones((3, 3), np.float32)
    run(q, "enqueue_many", components=[a, np.array([0, 1, 2], np.int32)])
    first = Ticket("dequeue")
    q.submit(first)
    run(q, "dequeue")  # the second element leaves
    run(q, "enqueue_many", components=[b, np.array([3, 4, 5], np.int32)])
    q.take_back(first)  # the first element back in front: 0, 2, 3, 4, 5
    bx, by = run(q, "dequeue_many", n=3)
    assert by.tolist() == [0, 2, 3] and bx.tolist() == [[0] * 3, [0] * 3, [1] * 3]
