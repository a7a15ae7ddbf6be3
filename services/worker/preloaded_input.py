"""Preloaded input (the seeds' preloading): the data set lives once on a ps shard, workers slice it.

Every worker computes the same seeded permutation of the rows for each epoch and
takes every `num_workers`-th batch of it, starting at its own index, so together
they see each row exactly once per epoch with no coordination. It offers the one
queue method the trainer uses, `dequeue_up_to_async`, and ends with OutOfRange.
"""

import numpy as np

from zmqflow.common.errors import OutOfRangeError


class _Done:
    def result(self):
        raise OutOfRangeError("preloaded input: every epoch has been handed out")

    def cancel(self):
        pass


def worker_batches(rows, epochs, batch_size, replica=0, num_workers=1, seed=0):
    """This worker's row indices, one array per batch, epoch after epoch."""
    for epoch in range(epochs):
        order = np.random.default_rng([seed, epoch]).permutation(rows)
        for k, start in enumerate(range(0, rows, batch_size)):
            if k % num_workers == replica:
                yield order[start:start + batch_size]


class PreloadedInput:
    def __init__(self, ps, name, rows, epochs, batch_size, replica=0, num_workers=1, seed=0, shard=0):
        self.ps, self.name, self.shard = ps, name, shard
        self.broker = None  # no reader pipeline behind it
        self._batches = worker_batches(rows, epochs, batch_size, replica, num_workers, seed)

    def dequeue_up_to_async(self, n, timeout=None):
        """The next batch's rows from the ps (n is the batch size given at construction)."""
        indices = next(self._batches, None)
        if indices is None:
            return _Done()
        return self.ps.take_rows_async(self.name, indices, self.shard)
