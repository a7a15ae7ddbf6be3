"""RandomShuffleQueue against docs/queue-semantics.md §3, §4: random takes, min_after_dequeue, exactly-once."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmqflow.common.errors import CancelledError, InvalidArgumentError, OutOfRangeError
from zmqflow.services.broker.queues import Ticket
from tests.broker.test_fifo_queue import (DEADLINE, HISTORY_OPS, check_conservation, drain, enq, enq_many, go, i32,
                                          make, ok, run_history, value)

pytestmark = pytest.mark.unit


def rsq(capacity=10, min_after_dequeue=0, seed=None, **kw):
    return make(capacity, kind="RandomShuffleQueue", min_after_dequeue=min_after_dequeue, seed=seed, **kw)


def test_delivers_every_element_exactly_once_in_a_shuffled_order():
    q = rsq(capacity=100, seed=7)
    enq_many(q, *range(100))
    got = value(go(q, "dequeue_many", n=60)) + [value(go(q, "dequeue")) for _ in range(40)]
    assert sorted(got) == list(range(100)) and got != list(range(100))


def test_unseeded_queue_works_and_first_take_is_spread_over_elements():
    firsts = set()
    for _ in range(200):
        q = rsq()
        enq_many(q, *range(5))
        firsts.add(value(go(q, "dequeue")))
    assert firsts == set(range(5))


def test_whole_tuples_stay_together():
    q = rsq(capacity=50, dtypes=("int32", "string"), shapes=([], []), seed=1)
    go(q, "enqueue_many", i32(*range(50)), np.array([str(v).encode() for v in range(50)], dtype=object))
    t = ok(go(q, "dequeue_many", n=50))
    assert [str(v).encode() for v in t.result[0].tolist()] == t.result[1].tolist()


def test_enqueue_blocks_at_capacity():
    q = rsq(capacity=2)
    enq(q, 1), enq(q, 2)
    e = enq(q, 3)
    assert not e.done
    go(q, "dequeue")
    assert ok(e) and q.size() == 2


def test_dequeue_waits_while_size_is_at_min_after_dequeue():
    q = rsq(capacity=10, min_after_dequeue=2)
    enq_many(q, 1, 2)
    d = go(q, "dequeue")
    assert not d.done and q.size() == 2
    enq(q, 3)
    assert ok(d) and q.size() == 2


def test_pending_dequeue_many_takes_each_element_above_the_minimum():
    q = rsq(capacity=10, min_after_dequeue=3)
    enq_many(q, *range(5))
    t = go(q, "dequeue_many", n=4)
    assert not t.done and q.size() == 3  # took 2, size sits at the minimum
    enq(q, 5)
    assert not t.done and q.size() == 3
    enq(q, 6)
    assert len(value(t)) == 4 and q.size() == 3


def test_dequeue_up_to_smaller_than_the_minimum_still_waits_for_n_while_open():
    q = rsq(capacity=10, min_after_dequeue=5)
    enq_many(q, *range(6))
    t = go(q, "dequeue_up_to", n=3)
    assert not t.done and q.size() == 5
    enq_many(q, 6, 7)
    assert len(value(t)) == 3 and q.size() == 5


def test_after_close_min_after_dequeue_no_longer_applies():
    q = rsq(capacity=10, min_after_dequeue=5)
    enq_many(q, *range(4))
    d = go(q, "dequeue")
    assert not d.done
    go(q, "close")
    assert ok(d)
    assert len(value(go(q, "dequeue_many", n=2))) == 2
    assert len(value(go(q, "dequeue_up_to", n=5))) == 1
    assert isinstance(go(q, "dequeue").error, OutOfRangeError)


def test_dequeue_many_after_close_with_too_few_is_out_of_range_and_restores_held():
    q = rsq(capacity=10, min_after_dequeue=1)
    enq_many(q, 1, 2, 3)
    t = go(q, "dequeue_many", n=5)  # takes 2, keeps 1 back
    assert q.size() == 1
    go(q, "close")
    assert isinstance(t.error, OutOfRangeError) and "requested 3, current size 1" in str(t.error)
    assert sorted(value(go(q, "dequeue_many", n=3))) == [1, 2, 3]


def test_dequeue_up_to_after_close_returns_all_remaining_including_held():
    q = rsq(capacity=10, min_after_dequeue=2)
    enq_many(q, 1, 2, 3)
    t = go(q, "dequeue_up_to", n=5)
    go(q, "close")
    assert sorted(value(t)) == [1, 2, 3]


def test_deadline_restores_held_elements():
    q = rsq(capacity=10, min_after_dequeue=1)
    enq_many(q, 1, 2, 3)
    t = go(q, "dequeue_many", n=5)
    assert q.cancel(t, DEADLINE) == [t] and q.size() == 3
    go(q, "close")
    assert sorted(value(go(q, "dequeue_many", n=3))) == [1, 2, 3]


def test_restored_elements_may_exceed_capacity_and_enqueues_then_wait():
    q = rsq(capacity=2, min_after_dequeue=1)
    enq_many(q, 1, 2)
    t = go(q, "dequeue_many", n=3)  # holds one, size sits at 1
    enq(q, 3)  # stored, then absorbed: holds two
    q.cancel(t, DEADLINE)
    assert q.size() == 3  # nothing is dropped to respect capacity
    e = enq(q, 4)
    assert not e.done
    go(q, "dequeue"), go(q, "dequeue")
    assert ok(e) and q.size() == 2


def test_closed_queue_cancels_enqueues():
    q = rsq()
    go(q, "close")
    assert isinstance(enq(q, 1).error, CancelledError)
    assert "RandomShuffleQueue 'q' is closed." == str(enq_many(q, 1).error)


def test_unshaped_random_shuffle_queue_refuses_batch_dequeues():
    q = rsq(shapes=None)
    go(q, "enqueue", np.zeros((2, 2), np.int32))
    for op in ("dequeue_many", "dequeue_up_to"):
        with pytest.raises(InvalidArgumentError):
            q.submit(Ticket(op, n=1))
    assert value(go(q, "dequeue")) == [[0, 0], [0, 0]]


@settings(max_examples=150, deadline=None)
@given(ops=HISTORY_OPS, capacity=st.sampled_from([-1, 1, 2, 3, 5]), min_after=st.integers(0, 3))
def test_random_histories_deliver_each_element_exactly_once(ops, capacity, min_after):
    if capacity >= 0:
        min_after = min(min_after, capacity - 1)
    q = rsq(capacity=capacity, min_after_dequeue=min_after, seed=3)
    offered, out = run_history(q, ops)
    check_conservation(offered, out)
    assert drain(q) == []
