"""Collects concurrent predict requests into one batch, then splits the batch's output back per request.

Why: one matrix product over 64 rows costs little more than over one, so a server that
runs requests together answers many more per second. A batch runs when it holds
`max_batch` rows or when its oldest request has waited `max_delay` seconds, whichever
comes first. A request's inputs are one array [n, ...] or, for a model of several inputs, a list
of arrays of n rows each (joined position by position). Plain code with no sockets or threads:
the service loop drives it.
"""

import collections

import numpy as np


class Batcher:
    def __init__(self, max_batch=256, max_delay=0.002):
        if max_batch < 1 or max_delay < 0:
            raise ValueError("max_batch must be >= 1 and max_delay >= 0")
        self.max_batch, self.max_delay = max_batch, max_delay
        self._queue = collections.OrderedDict()  # item -> (x, arrival), oldest first
        self.rows = 0

    def __len__(self):
        return len(self._queue)

    def add(self, item, x, now):
        """Queue `item` (any hashable, e.g. a parked call) with its inputs `x` ([n, ...] or a list of them)."""
        self._queue[item] = (x, now)
        self.rows += rows_of(x)

    def remove(self, item):
        """Withdraw a queued item (deadline passed, cancelled); True if it was queued."""
        entry = self._queue.pop(item, None)
        if entry is not None:
            self.rows -= rows_of(entry[0])
        return entry is not None

    def due(self):
        """When the next batch must run (monotonic seconds), or None when nothing is queued."""
        if not self._queue:
            return None
        return next(iter(self._queue.values()))[1] + self.max_delay

    def ready(self, now):
        return bool(self._queue) and (self.rows >= self.max_batch or now >= self.due())

    def runs_alone_now(self, x, arrival, now):
        """True when inputs `x` that arrived at `arrival` would make a batch of their own that runs at once: nothing
        is queued, and they fill a batch or have waited `max_delay` (always, with no delay). The server then answers
        them without queueing them: what `add` then `ready` and `take` would do, without the queue's bookkeeping."""
        return not self._queue and (now >= arrival + self.max_delay or rows_of(x) >= self.max_batch)

    def take(self):
        """(items, sizes, x): the oldest requests up to `max_batch` rows (always at least one), inputs joined."""
        items, parts, sizes = [], [], []
        taken = 0
        while self._queue:
            item, (x, _) = next(iter(self._queue.items()))
            rows = rows_of(x)
            if items and taken + rows > self.max_batch:
                break
            del self._queue[item]
            items.append(item)
            parts.append(x)
            sizes.append(rows)
            taken += rows
        self.rows -= taken
        if len(parts) == 1:
            return items, sizes, parts[0]
        if isinstance(parts[0], list):
            return items, sizes, [np.concatenate(column) for column in zip(*parts)]
        return items, sizes, np.concatenate(parts)

    @staticmethod
    def split(output, sizes):
        """Consecutive row blocks of `output`, one per request size."""
        if len(sizes) == 1 and len(output) == sizes[0]:
            return [output]  # a batch of one request (most, under light load)
        bounds = np.cumsum([0] + list(sizes))
        if len(output) != bounds[-1]:
            raise ValueError(f"batch output has {len(output)} rows, the requests {bounds[-1]}")
        return [output[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def run(self, fn):
        """Take one batch, compute `fn(x)` on it once, return [(item, its rows of the output)]."""
        items, sizes, x = self.take()
        return list(zip(items, self.split(fn(x), sizes)))


def rows_of(x):
    """The rows of inputs `x`: one array, or a list of arrays of as many rows each."""
    return len(x[0]) if isinstance(x, list) else len(x)
