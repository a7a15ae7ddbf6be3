"""FIFOQueue: take from the front, append at the back (docs/queue-semantics.md §4)."""

from collections import deque

from zmqflow.services.broker.queues.base import QueueBase, batch_of_rows


class FIFOQueue(QueueBase):
    """First in, first out; held elements given back go to the front in their original order."""

    kind = "FIFOQueue"

    def __init__(self, decl, name, quota=None):
        super().__init__(decl, name, quota)
        self._elements = deque()
        self._take = self._elements.popleft  # bound once: the hot path calls it per element

    def _restore(self, held):
        self._elements.extendleft(reversed(held))

    def _batch(self, held):
        # FIFO keeps each enqueue_many's rows in order, so a batch often is one slice of one message
        return batch_of_rows(held, self._dtypes)
