"""batch and shuffle_batch of the client library: TF's meaning over the broker, from iterables and from files."""

import collections

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError, OutOfRangeError
from zmqflow.services.reader.input_producers import batch, read_files, shuffle_batch
from tests.reader.conftest import ID_OPTIONS

pytestmark = pytest.mark.service


def test_batch_keeps_order_and_ends_with_a_short_batch_when_allowed(broker):
    items = ({"x": np.float32(i), "y": np.array([i, -i], np.int32)} for i in range(10))
    with batch(items, batch_size=4, capacity=5, allow_smaller_final_batch=True, broker=broker, timeout=10) as b:
        got = list(b)
    assert [g["x"].tolist() for g in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert got[0]["y"].shape == (4, 2) and got[0]["y"].dtype == np.int32


def test_batch_without_smaller_final_batch_drops_the_remainder_as_tf(broker):
    with batch(((i,) for i in range(10)), batch_size=4, broker=broker, timeout=10) as b:
        assert b.get().tolist() == [0, 1, 2, 3] and b.get().tolist() == [4, 5, 6, 7]
        with pytest.raises(OutOfRangeError):
            b.get()


def test_enqueue_many_and_dynamic_pad(broker):
    chunks = [(np.arange(6, dtype=np.int64).reshape(3, 2),), (np.arange(4, dtype=np.int64).reshape(2, 2),)]
    with batch(chunks, batch_size=5, enqueue_many=True, broker=broker, timeout=10) as b:
        assert b.get().shape == (5, 2)
    ragged = [(np.arange(n, dtype=np.int32),) for n in (1, 3, 2)]
    with batch(ragged, batch_size=3, dynamic_pad=True, broker=broker, timeout=10) as b:
        assert b.get().tolist() == [[0, 0, 0], [0, 1, 2], [0, 1, 0]]


def test_shuffle_batch_with_threads_delivers_each_item_once_in_another_order(broker):
    items = ({"i": np.int32(i)} for i in range(1000))
    with shuffle_batch(items, batch_size=100, capacity=500, min_after_dequeue=200, num_threads=3, seed=1,
                       allow_smaller_final_batch=True, broker=broker, timeout=10) as b:
        got = np.concatenate([g["i"] for g in b])
    assert sorted(got.tolist()) == list(range(1000)) and got[:100].tolist() != list(range(100))


def test_an_error_in_the_input_is_raised_by_get(broker):
    def items():
        yield (1,)
        yield (2,)
        raise ValueError("bad input row")
    with batch(items(), batch_size=1, capacity=10, broker=broker, timeout=10) as b:
        assert b.get().tolist() == [1] and b.get().tolist() == [2]
        with pytest.raises(ValueError, match="bad input row"):
            b.get()


def test_shuffle_batch_from_files_reads_every_instance_per_epoch(broker, id_shards):
    pattern, rows = id_shards
    files = read_files(pattern, "csv", ID_OPTIONS, num_epochs=2, seed=4, features=["id", "label"])
    with shuffle_batch(files, batch_size=500, capacity=2000, min_after_dequeue=1000, num_threads=2, seed=4,
                       allow_smaller_final_batch=True, broker=broker, timeout=20) as b:
        ids = np.concatenate([g["id"] for g in b])
    assert len(ids) == 2 * rows and set(collections.Counter(ids.tolist()).values()) == {2}


def test_closing_early_stops_the_reader_threads(broker, id_shards):
    pattern, _ = id_shards
    b = batch(read_files(pattern, "csv", ID_OPTIONS, num_epochs=None), batch_size=10, capacity=50, broker=broker,
              timeout=10)
    assert b.get()["id"].shape == (10,)
    b.close(timeout=20)
    assert not any(t.is_alive() for t in b._threads)


@pytest.mark.unit
def test_bad_arguments():
    with pytest.raises(InvalidArgumentError):
        batch([(1,)], batch_size=0, broker="tcp://127.0.0.1:1")
    with pytest.raises(InvalidArgumentError, match="empty"):
        batch([], batch_size=1, broker="tcp://127.0.0.1:1")
