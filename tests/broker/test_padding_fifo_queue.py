"""PaddingFIFOQueue against docs/queue-semantics.md §3, §4: shapes with unknown dims, padding per batch."""

import ml_dtypes
import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError, OutOfRangeError, ResourceExhaustedError
from zmqflow.services.broker.queues import Ticket
from tests.broker.test_fifo_queue import DEADLINE, go, i32, make, ok, value

pytestmark = pytest.mark.unit


def pad_q(shapes, dtypes=None, capacity=10):
    return make(capacity, dtypes=dtypes or ["int32"] * len(shapes), shapes=shapes, kind="PaddingFIFOQueue")


def test_enqueue_accepts_any_size_for_unknown_dims():
    q = pad_q([[None, 3]])
    ok(go(q, "enqueue", np.zeros((1, 3), np.int32)))
    ok(go(q, "enqueue", np.zeros((4, 3), np.int32)))
    assert q.size() == 2


def test_enqueue_with_wrong_known_dim_is_invalid_and_message_uses_question_marks():
    q = pad_q([[], [None, 3]])
    with pytest.raises(InvalidArgumentError, match=r"Shape mismatch in tuple component 1. Expected \[\?,3\], "
                                                   r"got \[3,4\]"):
        q.submit(Ticket("enqueue", [np.array(1, np.int32), np.zeros((3, 4), np.int32)]))
    assert q.size() == 0


def test_enqueue_with_wrong_rank_is_invalid():
    q = pad_q([[None]])
    for bad in (np.array(1, np.int32), np.zeros((2, 2), np.int32)):
        with pytest.raises(InvalidArgumentError):
            q.submit(Ticket("enqueue", [bad]))


def test_enqueue_many_checks_rank_and_known_dims_of_the_elements():
    q = pad_q([[None, 2]])
    ok(go(q, "enqueue_many", np.zeros((3, 5, 2), np.int32)))
    with pytest.raises(InvalidArgumentError, match=r"Expected \[3,\?,2\], got \[3,5,3\]"):
        q.submit(Ticket("enqueue_many", [np.zeros((3, 5, 3), np.int32)]))
    with pytest.raises(InvalidArgumentError):
        q.submit(Ticket("enqueue_many", [np.zeros((3, 2), np.int32)]))
    assert q.size() == 3


def test_dequeue_returns_the_element_unpadded():
    q = pad_q([[None]])
    go(q, "enqueue", i32(1, 2, 3))
    go(q, "enqueue", i32(4))
    assert value(go(q, "dequeue")) == [1, 2, 3] and value(go(q, "dequeue")) == [4]


def test_dequeue_many_pads_unknown_dims_to_the_batch_maximum_with_zeros():
    q = pad_q([[None, None], [2]])
    go(q, "enqueue", np.ones((1, 3), np.int32), i32(1, 1))
    go(q, "enqueue", np.full((2, 1), 2, np.int32), i32(2, 2))
    t = ok(go(q, "dequeue_many", n=2))
    assert t.result[0].tolist() == [[[1, 1, 1], [0, 0, 0]], [[2, 0, 0], [2, 0, 0]]]
    assert t.result[1].tolist() == [[1, 1], [2, 2]]


def test_padding_is_per_batch():
    q = pad_q([[None]])
    for v in ([1, 2, 3], [4], [5, 6]):
        go(q, "enqueue", i32(*v))
    assert value(go(q, "dequeue_many", n=2)) == [[1, 2, 3], [4, 0, 0]]
    assert value(go(q, "dequeue_many", n=1)) == [[5, 6]]


def test_short_dequeue_up_to_after_close_pads_only_to_its_own_maximum():
    q = pad_q([[None]])
    go(q, "enqueue", i32(1, 2, 3, 4))
    go(q, "enqueue", i32(5))
    go(q, "enqueue", i32(6, 7))
    assert value(go(q, "dequeue")) == [1, 2, 3, 4]
    t = go(q, "dequeue_up_to", n=5)
    go(q, "close")
    assert value(t) == [[5, 0], [6, 7]]


def test_dequeue_many_zero_has_zero_for_unknown_dims():
    q = pad_q([[None, 3], []], dtypes=["float32", "string"])
    t = ok(go(q, "dequeue_many", n=0))
    assert t.result[0].shape == (0, 0, 3) and t.result[0].dtype == np.float32
    assert t.result[1].shape == (0,) and t.result[1].dtype == object


@pytest.mark.parametrize("dtype,items,zero", [
    ("float32", [np.array([1.5], np.float32), np.array([], np.float32)], 0.0),
    ("bool", [np.array([True, True]), np.array([True])], False),
    ("string", [np.array([b"ab"], dtype=object), np.array([b"c", b"d"], dtype=object)], b""),
    ("bfloat16", [np.array([1, 2], ml_dtypes.bfloat16), np.array([3], ml_dtypes.bfloat16)], 0),
])
def test_padding_uses_the_zero_value_of_each_dtype(dtype, items, zero):
    q = pad_q([[None]], dtypes=[dtype])
    for item in items:
        ok(go(q, "enqueue", item))
    out = ok(go(q, "dequeue_many", n=2)).result[0]
    width = max(len(i) for i in items)
    assert out.shape == (2, width) and out.dtype == items[0].dtype
    for row, item in zip(out, items):
        assert row[:len(item)].tolist() == item.tolist()
        assert row[len(item):].tolist() == [zero] * (width - len(item))
    if dtype == "string":
        assert all(type(x) is bytes for x in out.reshape(-1).tolist())


def test_fully_defined_shapes_behave_like_fifo():
    q = pad_q([[2]])
    go(q, "enqueue_many", np.arange(6, dtype=np.int32).reshape(3, 2))
    assert value(go(q, "dequeue_many", n=3)) == [[0, 1], [2, 3], [4, 5]]


def test_scalar_components_in_a_padding_queue():
    q = pad_q([[], [None]], dtypes=["int32", "string"])
    go(q, "enqueue", np.array(1, np.int32), np.array([b"x"], dtype=object))
    go(q, "enqueue", np.array(2, np.int32), np.array([b"y", b"z"], dtype=object))
    t = ok(go(q, "dequeue_many", n=2))
    assert t.result[0].tolist() == [1, 2] and t.result[1].tolist() == [[b"x", b""], [b"y", b"z"]]
    assert all(type(x) is bytes for x in t.result[1].reshape(-1).tolist())


def test_deadline_restores_held_elements_in_order_and_they_are_padded_later():
    q = pad_q([[None]])
    go(q, "enqueue", i32(1, 1))
    t = go(q, "dequeue_many", n=2)
    q.cancel(t, DEADLINE)
    go(q, "enqueue", i32(2))
    assert value(go(q, "dequeue_many", n=2)) == [[1, 1], [2, 0]]


def test_closed_empty_padding_queue_dequeue_up_to_is_out_of_range():
    q = pad_q([[None]])
    go(q, "close")
    t = go(q, "dequeue_up_to", n=1)
    assert isinstance(t.error, OutOfRangeError) and str(t.error).startswith("PaddingFIFOQueue 'q' is closed")


def test_a_padded_batch_too_large_to_build_fails_and_gives_the_elements_back():
    q = pad_q([[None, None]], dtypes=["float64"])
    go(q, "enqueue", np.zeros((1, 2 ** 15), np.float64))
    go(q, "enqueue", np.zeros((2 ** 15, 1), np.float64))  # padded: 2 x 2**30 values
    t = go(q, "dequeue_many", n=2)
    assert isinstance(t.error, ResourceExhaustedError) and q.size() == 2
    assert go(q, "dequeue").result[0].shape == (1, 2 ** 15)  # order kept
