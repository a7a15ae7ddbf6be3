"""FIFOQueue: take from the front, append at the back (docs/queue-semantics.md §4).

A batch that went in with one enqueue_many and comes out whole with one dequeue_many (the reader -> worker
path) leaves as the message's own arrays: the run's first element carries the run (`_RunStart`), and a
batch of exactly that run's elements, in order (checked by identity), is answered with its slices, with no
per-row look at the rows. Any other batch takes the general path (`batch_of_rows`), as before.
"""

import operator
from collections import deque
from itertools import islice

from zmqflow.services.broker.queues.base import QueueBase, batch_of_rows, rows_of


class _RunStart(tuple):
    """The first element of an enqueue_many's rows. `run`: (the run's other elements in order, the components'
    [B]+shape slices they are rows of). No cycle: the run does not refer back to this element, so it goes by
    reference counting with the element."""


class FIFOQueue(QueueBase):
    """First in, first out; held elements given back go to the front in their original order."""

    kind = "FIFOQueue"
    _keeps_runs = True  # a kind whose batches are not slices of the rows (padding) does not

    def __init__(self, decl, name, quota=None):
        super().__init__(decl, name, quota)
        self._elements = deque()
        self._take = self._elements.popleft  # bound once: the hot path calls it per element

    def _restore(self, held):
        self._elements.extendleft(reversed(held))

    def _store_rows(self, components, start, end):
        if not self._keeps_runs or end - start < 2 or any(c.dtype.hasobject for c in components):
            super()._store_rows(components, start, end)
            return
        slices = [c[start:end] for c in components]
        rows = list(zip(*map(rows_of, slices)))
        first = rows[0] = _RunStart(rows[0])
        first.run = (rows[1:], slices)
        self._elements.extend(rows)

    def _batch(self, held):
        run = getattr(held[0], "run", None) if held else None
        if run is not None and len(held) == len(run[0]) + 1 and all(map(operator.is_, islice(held, 1, None), run[0])):
            return [_read_only(s) for s in run[1]]
        # FIFO keeps each enqueue_many's rows in order, so a batch often is one slice of one message
        return batch_of_rows(held, self._dtypes)


def _read_only(array):
    """A read-only view: the queue's rows are never written through what a dequeue answers."""
    view = array.view()
    view.flags.writeable = False
    return view
