"""The random-order queue's storage (queues/slab.py): every row stored comes out exactly once, whole, by
single takes, batches and give-backs, and its arrays are allocated once for a bounded queue."""

import numpy as np
import pytest

from zmqflow.services.broker.queues.slab import Slab

pytestmark = pytest.mark.unit


def make(capacity=64):
    return Slab((np.dtype(np.float32), np.dtype(np.int32)), [[3], []], capacity)


def rows(start, n):
    ids = np.arange(start, start + n, dtype=np.int32)
    return [np.repeat(ids[:, None], 3, axis=1).astype(np.float32), ids]


def test_every_row_comes_out_once_and_whole_by_takes_and_batches():
    slab, rng, seen = make(), np.random.default_rng(1), []
    slab.put(rows(0, 40), 0, 40)
    slab.put(rows(40, 20), 5, 20)  # part of a message: rows 45..59
    while len(slab) > 5:
        x, y = slab.take_many(rng.choice(len(slab), size=min(7, len(slab)), replace=False))
        assert (x == y[:, None]).all()
        seen.extend(y.tolist())
    while len(slab):
        x, y = slab.take(int(rng.integers(len(slab))))
        assert x.shape == (3,) and y.shape == () and (x == y).all()
        seen.append(int(y))
    assert sorted(seen) == list(range(40)) + list(range(45, 60))


def test_batch_taking_the_last_rows_moves_nothing_into_them():
    slab = make()
    slab.put(rows(0, 10), 0, 10)
    x, y = slab.take_many(np.array([9, 3, 8]))
    assert y.tolist() == [9, 3, 8] and len(slab) == 7
    rest = slab.take_many(np.arange(7))[1]
    assert sorted(rest.tolist()) == [0, 1, 2, 4, 5, 6, 7]


def test_given_back_elements_are_copied_in_and_rows_owned_by_the_slab():
    slab = make()
    message = rows(0, 4)
    slab.put(message, 0, 4)
    message[0][:] = -1  # the message's buffer is not kept: changing it changes nothing stored
    element = slab.take(0)
    slab.extend([element])
    assert sorted(slab.take_many(np.arange(4))[1].tolist()) == [0, 1, 2, 3]


def test_a_bounded_queue_allocates_its_arrays_once_and_an_unbounded_one_doubles():
    bounded = make(capacity=5000)
    bounded.put(rows(0, 10), 0, 10)
    assert bounded.nbytes() == 5000 * (3 * 4 + 4)
    unbounded = make(capacity=2 ** 62)
    unbounded.put(rows(0, 10), 0, 10)
    assert unbounded.nbytes() == 1024 * 16
    unbounded.put(rows(10, 1500), 0, 1500)
    assert unbounded.nbytes() == 2048 * 16 and len(unbounded) == 1510
