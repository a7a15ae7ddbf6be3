"""RandomShuffleQueue: each take picks a uniformly random stored element (§4).

min_after_dequeue gating lives in the shared service rule (QueueBase), which
ignores it once the queue is closed. Uniform draws come from a numpy Generator
seeded from the declared seed (or unseeded), in blocks, so one take costs a
list pop rather than a numpy call. Sequences need not match TensorFlow's.

Elements of one fixed shape live in a Slab (slab.py): copied in, gathered out
by index, so the queue's memory is the rows it holds. Elements of varying
shape or of strings stay views of their messages in a list.
"""

import numpy as np

from zmqflow.services.broker.queues.base import QueueBase, batch_of_rows, rows_of
from zmqflow.services.broker.queues.quota import element_overhead
from zmqflow.services.broker.queues.slab import Slab

_DRAWS = 256


class RandomShuffleQueue(QueueBase):
    """Random order, exactly-once delivery, at least min_after_dequeue left while open."""

    kind = "RandomShuffleQueue"

    def __init__(self, decl, name, quota=None):
        super().__init__(decl, name, quota)
        self._slab = self._row_bytes is not None
        if self._slab:
            self._elements = Slab(self._dtypes, self._shapes, self._capacity)
            self._row_bytes -= element_overhead(self._ncomp)  # a stored row costs its data alone
        else:
            self._elements = []
        seed = decl.seed
        self._rng = np.random.default_rng(None if seed is None else seed % 2 ** 64)
        self._uniform = []

    def _draw(self, n):
        """A uniform index in [0, n)."""
        if not self._uniform:
            self._uniform = self._rng.random(_DRAWS).tolist()
        return min(int(self._uniform.pop() * n), n - 1)

    def _take(self):
        elements = self._elements
        i = self._draw(len(elements))
        if self._slab:
            return elements.take(i)
        last = len(elements) - 1
        elements[i], elements[last] = elements[last], elements[i]  # swap-remove: O(1), order is irrelevant
        return elements.pop()

    def _take_many(self, k):
        if not self._slab or k < 2:
            return super()._take_many(k)
        batch = self._elements.take_many(self._rng.choice(len(self._elements), size=k, replace=False))
        return list(zip(*map(rows_of, batch)))  # row views of the gathered batch: _batch returns it whole

    def _store_rows(self, components, start, end):
        if self._slab:
            self._elements.put(components, start, end)
        else:
            super()._store_rows(components, start, end)

    def shrink(self):
        """A closed, drained queue's arrays go (a lease given back later allocates them again)."""
        if not self._slab or not self._closed or len(self._elements):
            return 0
        taken = self._elements.nbytes()
        self._elements.clear()
        return taken

    def _restore(self, held):
        self._elements.extend(held)

    def _batch(self, held):
        return batch_of_rows(held, self._dtypes) if self._slab else super()._batch(held)
