"""The batcher alone: size and delay bounds, order, withdrawal, splitting back per request."""

import numpy as np
import pytest

from zmqflow.services.serve.batcher import Batcher

pytestmark = pytest.mark.unit


def rows(n, start=0):
    return np.arange(start, start + n, dtype=np.float32).reshape(n, 1)


def test_runs_when_full_or_when_the_oldest_waited_long_enough():
    b = Batcher(max_batch=4, max_delay=0.01)
    assert b.due() is None and not b.ready(0.0)
    b.add("a", rows(2), now=1.0)
    assert b.due() == pytest.approx(1.01) and not b.ready(1.005) and b.ready(1.01)
    b.add("b", rows(2), now=1.005)
    assert b.ready(1.006)  # 4 rows: full


def test_a_request_runs_alone_at_once_only_when_nothing_waits_and_its_batch_is_due():
    b = Batcher(max_batch=4, max_delay=0.01)
    assert not b.runs_alone_now(rows(1), 1.0, 1.005)       # it would wait for company
    assert b.runs_alone_now(rows(1), 1.0, 1.01)            # it waited long enough (in the socket)
    assert b.runs_alone_now([rows(4)], 1.0, 1.0)           # it fills a batch (a list: a model of several inputs)
    assert Batcher(max_batch=4, max_delay=0.0).runs_alone_now(rows(1), 1.0, 1.0)
    b.add("a", rows(1), 1.0)
    assert not b.runs_alone_now(rows(4), 1.0, 2.0)         # another waits: it joins the queue, oldest first


def test_take_respects_max_batch_and_splits_back_in_order():
    b = Batcher(max_batch=5, max_delay=0.0)
    b.add("a", rows(2, 0), 0.0)
    b.add("b", rows(3, 2), 0.0)
    b.add("c", rows(2, 5), 0.0)
    out = b.run(lambda x: x * 10)
    assert [item for item, _ in out] == ["a", "b"]
    np.testing.assert_array_equal(out[1][1], rows(3, 2) * 10)
    assert len(b) == 1 and b.rows == 2
    items, sizes, x = b.take()
    assert items == ["c"] and sizes == [2] and x.shape == (2, 1)


def test_an_oversized_request_runs_alone_and_removed_items_never_run():
    b = Batcher(max_batch=2, max_delay=0.0)
    b.add("big", rows(5), 0.0)
    b.add("gone", rows(1), 0.0)
    assert b.remove("gone") and not b.remove("gone")
    items, sizes, x = b.take()
    assert items == ["big"] and x.shape == (5, 1) and len(b) == 0 and b.rows == 0


def test_split_checks_the_row_count():
    with pytest.raises(ValueError):
        Batcher.split(np.zeros((3, 2)), [1, 1])


def test_inputs_of_several_arrays_join_position_by_position():
    b = Batcher(max_batch=8, max_delay=0.0)
    b.add("a", [rows(2, 0), np.array([[1], [2]], np.int64)], 0.0)
    b.add("b", [rows(1, 2), np.array([[3]], np.int64)], 0.0)
    assert b.rows == 3
    items, sizes, x = b.take()
    assert items == ["a", "b"] and sizes == [2, 1]
    np.testing.assert_array_equal(x[0], rows(3))
    np.testing.assert_array_equal(x[1], [[1], [2], [3]])
    assert x[1].dtype == np.int64 and b.rows == 0
