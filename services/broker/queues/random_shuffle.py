"""RandomShuffleQueue: each take picks a uniformly random stored element (§4).

min_after_dequeue gating lives in the shared service rule (QueueBase), which
ignores it once the queue is closed. Uniform draws come from a numpy Generator
seeded from the declared seed (or unseeded), in blocks, so one take costs a
list pop rather than a numpy call. Sequences need not match TensorFlow's.
"""

import numpy as np

from zmqflow.services.broker.queues.base import QueueBase

_DRAWS = 256


class RandomShuffleQueue(QueueBase):
    """Random order, exactly-once delivery, at least min_after_dequeue left while open."""

    kind = "RandomShuffleQueue"

    def __init__(self, decl, name, quota=None):
        super().__init__(decl, name, quota)
        self._elements = []
        seed = decl.seed
        self._rng = np.random.default_rng(None if seed is None else seed % 2 ** 64)
        self._uniform = []

    def _take(self):
        elements = self._elements
        if not self._uniform:
            self._uniform = self._rng.random(_DRAWS).tolist()
        last = len(elements) - 1
        i = min(int(self._uniform.pop() * (last + 1)), last)
        elements[i], elements[last] = elements[last], elements[i]  # swap-remove: O(1), order is irrelevant
        return elements.pop()

    def _restore(self, held):
        self._elements.extend(held)
