"""FIFOQueue domain logic against docs/queue-semantics.md §2, §3, §5, §6 (no sockets).

Blocking is modelled by tickets that stay pending (done False) and complete on
a later submit/cancel; the list `submit` returns is what the server replies to.
"""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zmqflow.common.errors import CancelledError, DeadlineExceededError, InvalidArgumentError, OutOfRangeError
from zmqflow.services.broker.queues import QUEUE_CLASSES, QueueDeclaration, Ticket

pytestmark = pytest.mark.unit

DEADLINE = DeadlineExceededError("Timed out waiting for notification")


def make(capacity=10, dtypes=("int32",), shapes=([],), kind="FIFOQueue", **kw):
    decl = QueueDeclaration(kind, capacity, list(dtypes), None if shapes is None else [list(s) for s in shapes], **kw)
    decl.validate()
    return QUEUE_CLASSES[kind](decl, "q")


def i32(*values):
    return np.array(values, np.int32)


def go(q, op, *components, n=None, cancel=False, owner=None):
    """Submit one request; the ticket carries the list of tickets the call completed in `.tag`."""
    t = Ticket(op, list(components), n=n, cancel_pending_enqueues=cancel, owner=owner)
    t.tag = q.submit(t)
    return t


def enq(q, value, **kw):
    return go(q, "enqueue", np.array(value, np.int32), **kw)


def enq_many(q, *values, **kw):
    return go(q, "enqueue_many", i32(*values), **kw)


def ok(t):
    assert t.done and t.error is None, t.error
    return t


def value(t):
    """The int(s) a finished dequeue returned (first component)."""
    ok(t)
    return t.result[0].tolist()


def drain(q):
    """Close, then take what remains (list of ints)."""
    go(q, "close", cancel=True)
    t = go(q, "dequeue_up_to", n=10 ** 6)
    return [] if t.error else value(t)


# ------------------------------------------------ basics and capacity


def test_dequeue_returns_element_with_its_own_shape():
    q = make(dtypes=("float32", "int32"), shapes=([2], []))
    ok(go(q, "enqueue", np.array([1.5, 2.5], np.float32), np.array(7, np.int32)))
    t = ok(go(q, "dequeue"))
    assert t.result[0].shape == (2,) and t.result[0].dtype == np.float32 and t.result[0].tolist() == [1.5, 2.5]
    assert t.result[1].shape == () and t.result[1] == 7


def test_elements_come_out_in_fifo_order():
    q = make()
    for v in range(5):
        ok(enq(q, v))
    assert [value(go(q, "dequeue")) for _ in range(5)] == [0, 1, 2, 3, 4]


def test_negative_capacity_is_unbounded():
    q = make(capacity=-1)
    ok(enq_many(q, *range(1000)))
    ok(enq(q, 1000))
    assert q.size() == 1001


def test_capacity_zero_blocks_every_nonempty_enqueue():
    q = make(capacity=0)
    e = enq(q, 1)
    d = go(q, "dequeue")
    assert not e.done and not d.done and q.size() == 0
    ok(enq_many(q))  # an empty batch still succeeds
    assert q.describe()["waiting_enqueues"] == 1


def test_enqueue_blocks_when_full_and_completes_after_a_dequeue():
    q = make(capacity=2)
    ok(enq(q, 1)), ok(enq(q, 2))
    blocked = enq(q, 3)
    assert not blocked.done and blocked.tag == [] and q.size() == 2
    d = go(q, "dequeue")
    assert d.tag == [d, blocked] and ok(blocked)  # reply atomicity: both replies come from this call
    assert value(d) == 1 and q.size() == 2
    assert drain(q) == [2, 3]


def test_enqueue_completing_pending_dequeues_returns_them_all():
    q = make()
    d1, d2 = go(q, "dequeue"), go(q, "dequeue")
    t = enq_many(q, 1, 2)
    assert t.tag == [t, d1, d2]
    assert (value(d1), value(d2)) == (1, 2)


def test_describe_reports_waiting_counts_and_declaration():
    q = make(capacity=1)
    enq(q, 1), enq(q, 2), go(q, "close")
    info = q.describe()
    assert info["kind"] == "FIFOQueue" and info["name"] == "q" and info["capacity"] == 1
    assert info["size"] == 1 and info["closed"] is False  # a waiting close does not count
    assert (info["waiting_enqueues"], info["waiting_dequeues"]) == (2, 0)
    assert info["dtypes"] == ["int32"] and info["shapes"] == [[]] and info["min_after_dequeue"] == 0
    q = make()
    enq(q, 1), go(q, "dequeue_many", n=3)
    info = q.describe()
    assert (info["size"], info["waiting_enqueues"], info["waiting_dequeues"]) == (0, 0, 1)


# ------------------------------------------------ validation (§3): InvalidArgument, no effect


def assert_rejected(q, t_args, **kw):
    before = q.describe()
    t = Ticket(*t_args, **kw)
    with pytest.raises(InvalidArgumentError):
        q.submit(t)
    assert not t.done and not t.pending and q.describe() == before


def test_enqueue_wrong_component_count_is_invalid():
    q = make(dtypes=("int32", "int32"), shapes=([], []))
    assert_rejected(q, ("enqueue", [np.array(1, np.int32)]))
    assert_rejected(q, ("enqueue", [np.array(1, np.int32)] * 3))


def test_enqueue_dtype_must_match_exactly_no_casts():
    q = make()
    assert_rejected(q, ("enqueue", [np.array(1, np.int64)]))
    assert_rejected(q, ("enqueue", [np.array(1.0, np.float32)]))
    assert_rejected(q, ("enqueue_many", [np.array([1, 2], np.int64)]))
    with pytest.raises(InvalidArgumentError, match="Type mismatch in tuple component 0"):
        q.submit(Ticket("enqueue", [np.array(1, np.int64)]))


def test_enqueue_shape_must_equal_declared_shape():
    q = make(shapes=([2],))
    assert_rejected(q, ("enqueue", [i32(1, 2, 3)]))
    assert_rejected(q, ("enqueue", [i32(1, 2).reshape(1, 2)]))
    with pytest.raises(InvalidArgumentError, match=r"Shape mismatch in tuple component 0. Expected \[2\], got \[3\]"):
        q.submit(Ticket("enqueue", [i32(1, 2, 3)]))


def test_enqueue_component_must_be_an_array():
    q = make()
    assert_rejected(q, ("enqueue", [1]))
    assert_rejected(q, ("enqueue", "x"))
    assert_rejected(q, ("enqueue", None))  # None means no components


def test_a_ticket_cannot_be_submitted_twice():
    q = make()
    for t in (enq(q, 1), go(q, "dequeue_many", n=2)):
        with pytest.raises(InvalidArgumentError):
            q.submit(t)
    assert q.size() == 0 and q.describe()["waiting_dequeues"] == 1


def test_validation_happens_before_the_closed_check():
    q = make()
    ok(go(q, "close"))
    assert_rejected(q, ("enqueue", [np.array(1, np.int64)]))
    assert_rejected(q, ("dequeue_many",), n=-1)


def test_enqueue_many_refuses_scalar_components():
    q = make(shapes=None)
    assert_rejected(q, ("enqueue_many", [np.array(1, np.int32)]))


def test_enqueue_many_components_need_the_same_0th_dimension():
    """Without declared shapes TF compares the components' 0th dimensions."""
    q = make(dtypes=("int32", "int32"), shapes=None)
    with pytest.raises(InvalidArgumentError, match="same size in the 0th dimension"):
        q.submit(Ticket("enqueue_many", [i32(1, 2), i32(1, 2, 3)]))
    assert q.size() == 0


def test_enqueue_many_with_declared_shapes_reports_a_0th_dimension_mismatch_as_a_shape_mismatch():
    """With declared shapes TF checks each component against [B]+shape, B from component 0 (spec, enqueue_many)."""
    q = make(dtypes=("int32", "int32"), shapes=([], []))
    with pytest.raises(InvalidArgumentError,
                       match=re.escape("Shape mismatch in tuple component 1. Expected [2], got [3]")):
        q.submit(Ticket("enqueue_many", [i32(1, 2), i32(1, 2, 3)]))
    assert q.size() == 0
    wide = make(dtypes=("int32", "float32"), shapes=([], [4]))
    with pytest.raises(InvalidArgumentError,
                       match=re.escape("Shape mismatch in tuple component 1. Expected [2,4], got [3,4]")):
        wide.submit(Ticket("enqueue_many", [i32(1, 2), np.zeros((3, 4), np.float32)]))


def test_enqueue_many_checks_the_element_shape():
    q = make(shapes=([2],))
    assert_rejected(q, ("enqueue_many", [i32(1, 2)]))  # elements would be scalars
    with pytest.raises(InvalidArgumentError, match=r"Expected \[2,2\], got \[2,3\]"):
        q.submit(Ticket("enqueue_many", [np.zeros((2, 3), np.int32)]))


def test_unknown_op_is_invalid():
    q = make()
    assert_rejected(q, ("push", [i32(1)]))
    assert_rejected(q, (["enqueue"], [i32(1)]))


def test_dequeue_ops_take_no_tensors():
    q = make()
    assert_rejected(q, ("dequeue", [i32(1)]))
    assert_rejected(q, ("close", i32(1, 2)))


@pytest.mark.parametrize("op", ["dequeue_many", "dequeue_up_to"])
def test_batch_dequeue_refuses_negative_n_even_when_closed(op):
    q = make()
    assert_rejected(q, (op,), n=-1)
    with pytest.raises(InvalidArgumentError, match="requested -1 < 0 elements"):
        q.submit(Ticket(op, n=-1))
    ok(go(q, "close"))
    assert_rejected(q, (op,), n=-1)


@pytest.mark.parametrize("n", [None, 1.0, True, "2", [1]])
def test_batch_dequeue_needs_an_int_n(n):
    assert_rejected(make(), ("dequeue_many",), n=n)


@pytest.mark.parametrize("op", ["dequeue_many", "dequeue_up_to"])
def test_unshaped_queue_refuses_batch_dequeues_even_for_n0_and_closed(op):
    q = make(shapes=None)
    ok(go(q, "enqueue", np.zeros((2, 3), np.int32)))
    ok(go(q, "enqueue", np.zeros(5, np.int32)))  # any shape is accepted
    for n in (0, 1):
        with pytest.raises(InvalidArgumentError, match="require the components to have specified shapes"):
            q.submit(Ticket(op, n=n))
    ok(go(q, "close"))
    assert_rejected(q, (op,), n=1)
    assert value(go(q, "dequeue")) == [[0, 0, 0], [0, 0, 0]]


# ------------------------------------------------ enqueue_many


def test_enqueue_many_inserts_each_row_as_an_element():
    q = make(dtypes=("int32", "float32"), shapes=([], [2]))
    ok(go(q, "enqueue_many", i32(1, 2), np.array([[1, 2], [3, 4]], np.float32)))
    assert q.size() == 2
    t = ok(go(q, "dequeue"))
    assert t.result[0].shape == () and t.result[0] == 1 and t.result[1].tolist() == [1.0, 2.0]


def test_enqueue_many_makes_partial_progress_and_is_not_atomic():
    q = make(capacity=2)
    t = enq_many(q, 1, 2, 3, 4, 5)
    assert not t.done and q.size() == 2  # two inserted, three waiting
    assert value(go(q, "dequeue")) == 1
    assert not t.done and q.size() == 2
    assert value(go(q, "dequeue_many", n=2)) == [2, 3]
    ok(t)
    assert drain(q) == [4, 5]


def test_blocked_enqueue_many_is_served_before_later_enqueues_and_stays_contiguous():
    q = make(capacity=1)
    many = enq_many(q, 1, 2, 3)
    later = enq(q, 9)
    got = [value(go(q, "dequeue")) for _ in range(4)]
    assert got == [1, 2, 3, 9] and ok(many) and ok(later)


def test_enqueue_many_of_zero_elements_succeeds_immediately_even_when_closed():
    q = make(capacity=1)
    ok(enq(q, 1))
    blocked = enq(q, 2)
    t = enq_many(q)
    assert ok(t) and t.tag == [t] and not blocked.done  # not queued behind the blocked enqueue
    ok(go(q, "close", cancel=True))
    ok(enq_many(q))


def test_enqueue_many_on_closed_queue_is_cancelled():
    q = make()
    ok(go(q, "close"))
    t = enq_many(q, 1, 2)
    assert isinstance(t.error, CancelledError) and q.size() == 0


def test_size_excludes_not_yet_inserted_elements_of_a_pending_enqueue_many():
    q = make(capacity=3)
    enq_many(q, *range(10))
    assert q.size() == 3


# ------------------------------------------------ dequeue kinds


def test_blocked_dequeuers_are_served_in_arrival_order():
    q = make()
    ds = [go(q, "dequeue") for _ in range(3)]
    for v in (10, 11, 12):
        enq(q, v)
    assert [value(d) for d in ds] == [10, 11, 12]


def test_dequeue_many_stacks_a_batch_of_shape_B_plus_shape():
    q = make(dtypes=("int32", "float64"), shapes=([], [2, 2]))
    ok(go(q, "enqueue_many", i32(1, 2, 3), np.arange(12, dtype=np.float64).reshape(3, 2, 2)))
    t = ok(go(q, "dequeue_many", n=2))
    assert t.result[0].tolist() == [1, 2] and t.result[1].shape == (2, 2, 2) and t.result[1].dtype == np.float64
    assert t.result[1][1].tolist() == [[4.0, 5.0], [6.0, 7.0]]


def test_dequeue_many_zero_gives_an_empty_batch_immediately():
    q = make(dtypes=("int32", "float32"), shapes=([], [3]))
    waiting = go(q, "dequeue")
    t = go(q, "dequeue_many", n=0)
    assert t.tag == [t] and ok(t) and not waiting.done
    assert t.result[0].shape == (0,) and t.result[1].shape == (0, 3) and t.result[1].dtype == np.float32
    ok(go(q, "close"))
    assert ok(go(q, "dequeue_up_to", n=0)).result[1].shape == (0, 3)  # also when closed and empty


def test_dequeue_many_of_more_than_capacity_works():
    q = make(capacity=2)
    d = go(q, "dequeue_many", n=5)
    enqs = [enq(q, v) for v in range(5)]
    assert value(d) == [0, 1, 2, 3, 4] and all(ok(e) for e in enqs)


def test_pending_dequeue_many_at_head_absorbs_elements_before_a_later_dequeue():
    q = make()
    many = go(q, "dequeue_many", n=3)
    single = go(q, "dequeue")
    enq(q, 1), enq(q, 2)
    assert not many.done and not single.done
    assert q.size() == 0  # absorbed elements are not counted
    enq_many(q, 3, 4)
    assert value(many) == [1, 2, 3] and value(single) == 4


def test_dequeue_up_to_waits_for_n_while_open():
    q = make()
    t = go(q, "dequeue_up_to", n=3)
    enq_many(q, 1, 2)
    assert not t.done
    enq(q, 3)
    assert value(t) == [1, 2, 3]


# ------------------------------------------------ close


def test_close_sets_the_flag_and_enqueues_then_fail_cancelled():
    q = make()
    t = ok(go(q, "close"))
    assert t.tag == [t] and q.is_closed()
    e = enq(q, 1)
    assert isinstance(e.error, CancelledError) and str(e.error) == "FIFOQueue 'q' is closed."


def test_second_plain_close_is_cancelled():
    q = make()
    ok(go(q, "close"))
    t = go(q, "close")
    assert isinstance(t.error, CancelledError) and "already closed" in str(t.error)
    assert q.is_closed()


def test_close_waits_behind_blocked_enqueues():
    q = make(capacity=1)
    ok(enq(q, 1))
    blocked = enq(q, 2)
    close = go(q, "close")
    after = enq(q, 3)
    assert not close.done and not q.is_closed()  # a waiting close does not count
    d = go(q, "dequeue")
    assert d.tag == [d, blocked, close, after]
    assert ok(blocked) and ok(close) and q.is_closed() and isinstance(after.error, CancelledError)
    assert value(go(q, "dequeue")) == 2
    assert isinstance(go(q, "dequeue").error, OutOfRangeError)


def test_dequeue_on_closed_empty_queue_is_out_of_range():
    q = make()
    d = go(q, "dequeue")
    go(q, "close")
    assert isinstance(d.error, OutOfRangeError)
    assert str(d.error) == "FIFOQueue 'q' is closed and has insufficient elements (requested 1, current size 0)"


def test_dequeue_after_close_drains_what_remains():
    q = make()
    enq_many(q, 1, 2, 3)
    go(q, "close")
    assert value(go(q, "dequeue")) == 1
    assert value(go(q, "dequeue_many", n=2)) == [2, 3]
    assert isinstance(go(q, "dequeue_many", n=1).error, OutOfRangeError)


def test_dequeue_many_after_close_out_of_range_names_the_missing_count_and_restores_held():
    q = make()
    enq_many(q, 1, 2)
    t = go(q, "dequeue_many", n=5)
    assert not t.done and q.size() == 0
    go(q, "close")
    assert isinstance(t.error, OutOfRangeError) and "(requested 3, current size 0)" in str(t.error)
    assert q.size() == 2  # nothing consumed
    assert value(go(q, "dequeue_many", n=2)) == [1, 2]


def test_dequeue_many_on_closed_queue_with_too_few_elements_consumes_nothing():
    q = make()
    enq_many(q, 1, 2)
    go(q, "close")
    t = go(q, "dequeue_many", n=3)
    assert isinstance(t.error, OutOfRangeError) and "(requested 3, current size 2)" in str(t.error)
    assert q.size() == 2


def test_dequeue_up_to_after_close_returns_the_rest_in_order():
    q = make()
    enq(q, 1)
    t = go(q, "dequeue_up_to", n=5)  # holds the 1
    enq(q, 2)
    go(q, "close")
    assert value(t) == [1, 2] and q.size() == 0
    assert isinstance(go(q, "dequeue_up_to", n=5).error, OutOfRangeError)


def test_dequeue_up_to_on_a_closed_queue_with_enough_elements_returns_n():
    q = make()
    enq_many(q, 1, 2, 3)
    go(q, "close")
    assert value(go(q, "dequeue_up_to", n=2)) == [1, 2]
    assert value(go(q, "dequeue_up_to", n=2)) == [3]


def test_cancelling_close_fails_pending_enqueues_and_keeps_inserted_elements():
    q = make(capacity=2)
    many = enq_many(q, 1, 2, 3)
    single = enq(q, 4)
    plain_close = go(q, "close")
    c = go(q, "close", cancel=True)
    assert c.tag == [many, single, plain_close, c] and ok(c)
    for t in (many, single, plain_close):
        assert isinstance(t.error, CancelledError) and str(t.error) == "Enqueue operation was cancelled"
    assert q.is_closed() and drain(q) == [1, 2]


def test_cancelling_close_on_a_closed_queue_is_ok():
    q = make()
    ok(go(q, "close"))
    ok(go(q, "close", cancel=True))
    assert isinstance(go(q, "close").error, CancelledError)


def test_cancelling_close_wakes_blocked_dequeuers():
    q = make()
    upto, single = go(q, "dequeue_up_to", n=3), go(q, "dequeue")
    enq(q, 1)
    c = go(q, "close", cancel=True)
    assert c.tag == [c, upto, single]
    assert value(upto) == [1] and isinstance(single.error, OutOfRangeError)


def test_min_after_dequeue_is_zero_for_fifo_after_close_every_kind_still_succeeds():
    q = make()
    enq_many(q, *range(6))
    go(q, "close")
    assert value(go(q, "dequeue")) == 0
    assert value(go(q, "dequeue_many", n=2)) == [1, 2]
    assert value(go(q, "dequeue_up_to", n=2)) == [3, 4]
    assert value(go(q, "dequeue_up_to", n=2)) == [5]


# ------------------------------------------------ deadlines and cancellation (§5)


def test_deadline_on_dequeue_many_restores_held_elements_to_the_front_in_order():
    q = make()
    enq_many(q, 1, 2)
    t = go(q, "dequeue_many", n=3)
    assert q.size() == 0
    assert q.cancel(t, DEADLINE) == [t] and t.error is DEADLINE
    enq(q, 3)
    assert value(go(q, "dequeue_many", n=3)) == [1, 2, 3]


def test_cancelling_the_head_lets_later_requests_proceed():
    q = make()
    enq(q, 1)
    many = go(q, "dequeue_many", n=2)
    single = go(q, "dequeue")
    done = q.cancel(many, DEADLINE)
    assert done == [many, single] and value(single) == 1


def test_timed_out_enqueue_many_keeps_what_it_inserted():
    q = make(capacity=2)
    t = enq_many(q, 1, 2, 3)
    assert q.cancel(t, DEADLINE) == [t] and isinstance(t.error, DeadlineExceededError)
    go(q, "dequeue")
    assert q.size() == 1 and drain(q) == [2]  # the 3 is never inserted later


def test_cancelling_a_blocked_enqueue_lets_the_close_behind_it_complete():
    q = make(capacity=1)
    enq(q, 1)
    blocked = enq(q, 2)
    close = go(q, "close")
    assert q.cancel(blocked, DEADLINE) == [blocked, close] and ok(close) and q.is_closed()


def test_deadline_on_a_waiting_plain_close_withdraws_it_and_the_queue_stays_open():
    q = make(capacity=1)
    enq(q, 1)
    blocked = enq(q, 2)
    close = go(q, "close")
    assert q.cancel(close, DEADLINE) == [close] and isinstance(close.error, DeadlineExceededError)
    assert value(go(q, "dequeue")) == 1 and ok(blocked)
    assert not q.is_closed() and q.describe()["waiting_enqueues"] == 0


def test_cancel_of_a_finished_or_foreign_ticket_is_a_no_op():
    q, other = make(), make()
    t = ok(enq(q, 1))
    assert q.cancel(t, DEADLINE) == [] and t.error is None
    pending = go(other, "dequeue")
    assert q.cancel(pending, DEADLINE) == [] and not pending.done


def test_cancel_owner_withdraws_only_that_clients_requests_and_restores_held():
    q = make()
    enq(q, 5)
    gone = go(q, "dequeue_many", n=2, owner="a")
    stays = go(q, "dequeue", owner="b")
    err = CancelledError("Dequeue operation was cancelled")
    done = q.cancel_owner("a", err)
    assert done == [gone, stays] and gone.error is err and value(stays) == 5


def test_cancel_all_fails_every_pending_request_cancelled():
    q = make(capacity=1)
    enq(q, 1)
    e = enq(q, 2)
    c = go(q, "close")
    d = go(q, "dequeue_many", n=0)  # immediate, never pending
    err = CancelledError("reset")
    assert q.cancel_all(err) == [e, c] and ok(d)
    assert e.error is err and c.error is err and not q.is_closed() and q.size() == 1


# ------------------------------------------------ dtypes


def test_string_components_round_trip_and_batch():
    q = make(dtypes=("string", "int32"), shapes=([], []))
    ok(go(q, "enqueue", np.array(b"abc", dtype=object), np.array(1, np.int32)))
    ok(go(q, "enqueue_many", np.array([b"", b"\x00\xff"], dtype=object), i32(2, 3)))
    assert ok(go(q, "dequeue")).result[0] == b"abc"
    ok(go(q, "enqueue_many", np.array([b"z"], dtype=object), i32(4)))
    t = ok(go(q, "dequeue_many", n=2))
    single = ok(go(q, "dequeue")).result[0]
    assert single.shape == () and type(single.item()) is bytes and single.item() == b"z"
    assert t.result[0].dtype == object and t.result[0].tolist() == [b"", b"\x00\xff"]
    assert all(type(x) is bytes for x in t.result[0].tolist())  # bytes, not nested 0-d arrays
    assert_rejected(q, ("enqueue", [np.array("abc"), np.array(1, np.int32)]))  # numpy unicode is not 'string'


def test_bfloat16_components():
    import ml_dtypes
    bf16 = np.dtype(ml_dtypes.bfloat16)
    q = make(dtypes=("bfloat16",), shapes=([2],))
    ok(go(q, "enqueue_many", np.array([[1, 2], [3, 4]], bf16)))
    t = ok(go(q, "dequeue_many", n=2))
    assert t.result[0].dtype == bf16 and t.result[0].astype(np.float32).tolist() == [[1, 2], [3, 4]]
    assert_rejected(q, ("enqueue", [np.array([1, 2], np.float16)]))


# ------------------------------------------------ property: no element lost or duplicated


HISTORY_OPS = st.lists(st.one_of(
    st.tuples(st.sampled_from(["enqueue", "dequeue", "close", "close_cancel"]), st.just(0), st.integers(0, 2)),
    st.tuples(st.sampled_from(["enqueue_many", "dequeue_many", "dequeue_up_to"]), st.integers(0, 4),
              st.integers(0, 2)),
    st.tuples(st.sampled_from(["deadline", "cancel_owner"]), st.integers(0, 50), st.integers(0, 2)),
), max_size=40)


def run_history(q, ops):
    """Apply a random interleaving; return (offered values per enqueue ticket, values out in delivery order)."""
    counter, offered, tickets, out = iter(range(10 ** 6)), {}, [], []

    def record(done):
        for d in done:
            assert d.done and not d.pending
            if d.op == "dequeue" and d.error is None:
                out.append(int(d.result[0]))
            elif d.op in ("dequeue_many", "dequeue_up_to") and d.error is None:
                assert len(d.result[0]) == d.n or d.op == "dequeue_up_to" and len(d.result[0]) < d.n
                out.extend(d.result[0].tolist())

    for op, arg, owner in ops:
        if op in ("deadline", "cancel_owner"):
            pending = [t for t in tickets if t.pending]
            if op == "cancel_owner":
                record(q.cancel_owner(owner, CancelledError("gone")))
            elif pending:
                record(q.cancel(pending[arg % len(pending)], DEADLINE))
            continue
        if op in ("enqueue", "enqueue_many"):
            values = [next(counter) for _ in range(arg if op == "enqueue_many" else 1)]
            comp = i32(*values) if op == "enqueue_many" else np.array(values[0], np.int32)
            t = Ticket(op, [comp], owner=owner)
            offered[t] = values
        else:
            t = Ticket("close" if op.startswith("close") else op, n=arg if op.endswith("_many") or
                       op.endswith("_up_to") else None, cancel_pending_enqueues=op == "close_cancel", owner=owner)
        tickets.append(t)
        record(q.submit(t))  # (size may exceed capacity: restored elements are never dropped)
    record(q.cancel_all(CancelledError("reset")))
    assert all(t.done for t in tickets)
    return offered, out + drain(q)


def check_conservation(offered, out):
    assert len(out) == len(set(out)), "an element was delivered twice"
    out_set = set(out)
    for t, values in offered.items():
        kept = [v for v in values if v in out_set]
        if t.error is None:
            assert kept == values, "a successful enqueue lost elements"
        elif t.op == "enqueue":
            assert kept == []
        else:
            assert kept == values[:len(kept)], "a failed enqueue_many kept something other than a prefix"
    assert out_set <= {v for values in offered.values() for v in values}


@pytest.mark.parametrize("kind", ["FIFOQueue", "PaddingFIFOQueue"])
@settings(max_examples=150, deadline=None)
@given(ops=HISTORY_OPS, capacity=st.sampled_from([-1, 0, 1, 2, 3, 5]))
def test_random_histories_conserve_elements_and_fifo_order(kind, ops, capacity):
    offered, out = run_history(make(capacity=capacity, kind=kind), ops)
    check_conservation(offered, out)
    assert out == sorted(out), "FIFO order broken (restores must go back to the front in order)"
