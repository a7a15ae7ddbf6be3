"""The ring all-reduce's arithmetic (services/worker/ring.py) against numpy: every rank ends with the sum,
bit-identical on every rank, for 1..5 ranks and sizes that do not divide by the ranks (smaller ones too)."""

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.services.worker import ring

pytestmark = pytest.mark.unit


def run_ring(buffers):
    """Drive one generator per rank in lock step: each exchange, rank r's chunk goes to rank r + 1."""
    n = len(buffers)
    gens = [ring.all_reduce(b, r, n) for r, b in enumerate(buffers)]
    outgoing = [next(g, None) for g in gens]
    exchanges = 0
    while outgoing[0] is not None:
        sent = [o.copy() for o in outgoing]          # the transport copies the view before the next receive
        outgoing = [_send(g, sent[(r - 1) % n]) for r, g in enumerate(gens)]
        exchanges += 1
    assert all(o is None for o in outgoing)
    return exchanges


def _send(gen, value):
    try:
        return gen.send(value)
    except StopIteration:
        return None


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("size", [0, 1, 2, 3, 7, 10, 101, 1000, 4099])
def test_every_rank_ends_with_the_sum_bit_identical(ranks, size):
    rng = np.random.default_rng(size * 10 + ranks)
    originals = [rng.standard_normal(size).astype(np.float32) for _ in range(ranks)]
    buffers = [o.copy() for o in originals]
    exchanges = run_ring(buffers)
    assert exchanges == ring.exchanges(ranks)
    np.testing.assert_allclose(buffers[0] / ranks, np.mean(originals, axis=0), rtol=1e-5, atol=1e-6)
    for b in buffers[1:]:
        assert b.tobytes() == buffers[0].tobytes()


def test_chunks_are_near_equal_and_cover_the_buffer():
    assert ring.chunk_bounds(10, 3) == [0, 4, 7, 10]
    assert ring.chunk_bounds(2, 4) == [0, 1, 2, 2, 2]
    with pytest.raises(InvalidArgumentError, match="at least one rank"):
        ring.chunk_bounds(5, 0)


def test_each_rank_sends_every_chunk_but_one_in_reduce_scatter():
    for n in range(2, 6):
        for r in range(n):
            sent = {ring.reduce_scatter_chunks(r, n, s)[0] for s in range(n - 1)}
            assert sent == set(range(n)) - {(r + 1) % n}   # the chunk it ends up owning


def test_pack_weights_by_rows_and_unpack_gives_the_big_batch_mean():
    names, shapes = ["b", "w"], {"w": (2, 3), "b": (3,)}
    dtypes = {n: np.float32 for n in names}
    g0 = {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}
    g1 = {"w": np.full((2, 3), 4, np.float32), "b": np.ones(3, np.float32)}
    empty = {n: np.zeros(shapes[n], np.float32) for n in names}
    buffers = [ring.pack(names, g0, 100), ring.pack(names, g1, 50), ring.pack(names, empty, 0, stop=True)]
    run_ring(buffers)
    grads, rows, stop = ring.unpack(buffers[2], names, shapes, dtypes)
    assert rows == 150 and stop
    np.testing.assert_allclose(grads["w"], np.full((2, 3), (100 + 200) / 150))
    np.testing.assert_allclose(grads["b"], np.full(3, 50 / 150))
    assert ring.unpack(ring.pack(names, empty, 0), names, shapes, dtypes) == ({}, 0, False)


def test_a_chunk_of_the_wrong_size_is_named():
    gen = ring.all_reduce(np.zeros(4, np.float32), 0, 2)
    next(gen)
    with pytest.raises(InvalidArgumentError, match="expected a chunk of float32 \\[2\\]"):
        gen.send(np.zeros(3, np.float32))
