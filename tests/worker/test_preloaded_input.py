"""Preloaded input: workers slicing one data set cover every row exactly once per epoch, no coordination."""

import collections

import numpy as np
import pytest

from zmqflow.common.errors import OutOfRangeError
from zmqflow.services.worker.preloaded_input import PreloadedInput, worker_batches

pytestmark = pytest.mark.unit


def test_workers_together_see_each_row_once_per_epoch():
    rows, epochs, workers = 450, 3, 2
    seen = collections.Counter()
    per_worker = []
    for replica in range(workers):
        batches = list(worker_batches(rows, epochs, 100, replica, workers, seed=7))
        per_worker.append(sum(len(b) for b in batches))
        for b in batches:
            seen.update(b.tolist())
    assert set(seen) == set(range(rows)) and set(seen.values()) == {epochs}
    assert per_worker == [3 * 250, 3 * 200]  # batches 0,2,4 (the last of 50 rows) to worker 0; 1,3 to worker 1


def test_epochs_are_shuffled_differently_and_reproducibly():
    a = list(worker_batches(200, 2, 200, seed=1))
    b = list(worker_batches(200, 2, 200, seed=1))
    assert not np.array_equal(a[0], a[1]) and all(np.array_equal(x, y) for x, y in zip(a, b))


class FakePs:
    def take_rows_async(self, name, indices, shard=0):
        class Done:
            def result(self_inner):
                return {"label": np.asarray(indices)}
        return Done()


def test_input_ends_with_out_of_range():
    source = PreloadedInput(FakePs(), "train", rows=5, epochs=1, batch_size=3)
    assert len(source.dequeue_up_to_async(3).result()["label"]) == 3
    assert len(source.dequeue_up_to_async(3).result()["label"]) == 2
    with pytest.raises(OutOfRangeError):
        source.dequeue_up_to_async(3).result()
