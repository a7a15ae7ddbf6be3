"""Rows kept in the queue's own arrays: a random-order queue's storage when its elements have one shape.

A stored row of a RandomShuffleQueue used to be a view of the message that brought it, so one row still in
the queue kept its whole message alive; taken at random, the last rows of many messages lingered and a
queue of 68 MB sat behind 266-450 MB of RSS. Here an enqueue_many copies its rows into one array per
component (memcpy, the message freed at once) and a batch is gathered out of them by index, so the memory is
the rows held: the arrays double as they fill, up to the queue's capacity. Rows stay dense in [0, len): a
taken row's place is filled from the end, which keeps every take O(1) and the order irrelevant (§4).
Elements that leave are tuples of arrays that own (or view a batch's) data, like every other queue's.
"""

import numpy as np

_FIRST_ROWS = 1024
WHOLE_BYTES = 1 << 30
"""A queue whose capacity fits in this many bytes gets its arrays at once (their pages are touched as rows
first reach them); a larger or unbounded one doubles them as it fills. The malloc settings of
common/memory.py keep freed blocks in the process, so each doubling left its predecessors behind:
1k+2k+...+16k+20k rows held 2.7x the bytes of a full 20,000-row queue."""


class Slab:
    """Dense rows of a fixed-shape element, one array per component."""

    def __init__(self, dtypes, shapes, capacity):
        self._dtypes, self._shapes, self._capacity = dtypes, [tuple(s) for s in shapes], capacity
        self._columns = None  # allocated on the first row
        self._row_nbytes = sum(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                               for shape, dtype in zip(self._shapes, dtypes))
        self._n = 0

    def __len__(self):
        return self._n

    def clear(self):
        self._columns, self._n = None, 0

    def _room_for(self, more):
        need = self._n + more
        size = 0 if self._columns is None else len(self._columns[0])
        if need <= size:
            return
        if size == 0 and self._capacity * self._row_nbytes <= WHOLE_BYTES:
            grown = max(self._capacity, need)  # at once: untouched pages cost nothing, and nothing is left behind
        else:
            grown = min(max(need, 2 * size, _FIRST_ROWS), max(self._capacity, need))
        columns = [np.empty((grown,) + shape, dtype) for shape, dtype in zip(self._shapes, self._dtypes)]
        if self._columns is not None:
            for new, old in zip(columns, self._columns):
                new[:self._n] = old[:self._n]
        self._columns = columns

    def put(self, components, start, end):
        """Copy rows start..end of an enqueue_many's components in."""
        self._room_for(end - start)
        n = self._n
        for column, part in zip(self._columns, components):
            column[n:n + end - start] = part[start:end]
        self._n = n + end - start

    def append(self, element):
        self._room_for(1)
        for column, part in zip(self._columns, element):
            column[self._n] = part
        self._n += 1

    def extend(self, elements):
        for element in elements:
            self.append(element)

    def take(self, i):
        """Row i as an element of its own, its place filled by the last row."""
        last = self._n - 1
        element = tuple(column[i, ...].copy() for column in self._columns)
        if i != last:
            for column in self._columns:
                column[i] = column[last]
        self._n = last
        return element

    def take_many(self, indices):
        """The rows at `indices` (distinct) as one array per component; their places filled from the end."""
        k, n = len(indices), self._n
        out = [column[indices] for column in self._columns]
        keep = n - k
        holes = indices[indices < keep]
        if len(holes):
            tail = np.ones(k, bool)
            tail[indices[indices >= keep] - keep] = False  # tail rows taken themselves: nothing to move
            movers = np.arange(keep, n)[tail]
            for column in self._columns:
                column[holes] = column[movers]
        self._n = keep
        return out

    def nbytes(self):
        """Bytes of the arrays (allocated; their pages are touched as rows first reach them)."""
        return 0 if self._columns is None else sum(column.nbytes for column in self._columns)
