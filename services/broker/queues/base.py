"""The queue state machine shared by every kind (docs/queue-semantics.md §2, §3, §5).

A queue holds its elements (tuples of arrays, one per component), a closed
flag and two FIFO lists of pending tickets: E (enqueue, enqueue_many, plain
close) and D (dequeue, dequeue_many, dequeue_up_to). After every change it runs

    repeat { p = serve(E); p = serve(D) or p } until not p

where serve() tries the head of a list until one does not COMPLETE. This one
rule gives TF's ordering: dequeuers served in arrival order, a dequeue_many at
the head absorbing elements before later dequeues, a close waiting behind
earlier blocked enqueues. Subclasses only say how elements are stored, taken,
restored, shape-checked and batched.
"""

import sys
from collections import OrderedDict

import numpy as np

from zmqflow.common.wire import dtypes as wire_dtypes
from zmqflow.common.errors import CancelledError, InvalidArgumentError, OutOfRangeError, ResourceExhaustedError
from zmqflow.services.broker.queues.declaration import format_shape
from zmqflow.services.broker.queues.quota import Quota, element_overhead, fixed_row_bytes, nbytes
from zmqflow.services.broker.queues.ticket import BATCH_DEQUEUE_OPS, ENQUEUE_OPS, OPS, Ticket

COMPLETE, PROGRESS, NO_PROGRESS = 2, 1, 0


def stack(parts, dtype):
    """One [B]+shape array from B equal-shape arrays.

    np.array copies in C (several times faster than np.stack's Python loop), but
    would nest 0-d object arrays instead of their bytes, so strings use np.stack.
    """
    if dtype.hasobject:
        return np.stack(parts)
    return np.array(parts, dtype=dtype)


def consecutive_rows(parts):
    """The B parts as one [B]+shape view when they are consecutive rows of one buffer, else None.

    A batch that went in with enqueue_many and comes out whole with dequeue_many
    (the usual reader -> worker path) then leaves the broker without a copy.
    Precondition (FIFO order): rows of one buffer appear at most once each and in
    ascending order, so equal bases and a span of exactly B-1 rows mean consecutive.
    A plain loop over the bases and the ndarray constructor over the base: a generator in any() and
    as_strided cost several times more per 100-row batch.
    """
    first, last = parts[0], parts[-1]
    base = first.base
    if type(base) is not np.ndarray or first.dtype.hasobject or not first.flags.c_contiguous \
            or not base.flags.c_contiguous:  # the view is made over its buffer
        return None
    for part in parts:
        if part.base is not base:
            return None
    step = first.nbytes
    start = first.ctypes.data
    if last.ctypes.data - start != (len(parts) - 1) * step:
        return None
    batch = np.ndarray((len(parts),) + first.shape, first.dtype, buffer=base, offset=start - base.ctypes.data,
                       strides=(step,) + first.strides)
    batch.flags.writeable = False
    return batch


def rows_of(array):
    """Per-row views of an array: iterating a rank>1 array yields them in C; a rank-1 array would yield
    scalars (bytes for strings), so its rows are 0-d views."""
    return list(array) if array.ndim > 1 else [array[k, ...] for k in range(len(array))]


def batch_of_rows(held, dtypes):
    """The [B]+shape arrays of the elements `held`: a view where a component's rows are consecutive rows of
    one buffer (a batch that went in, or was gathered, whole), else a copy."""
    out = []
    for i, dtype in enumerate(dtypes):
        parts = [e[i] for e in held]
        rows = consecutive_rows(parts) if parts else None
        out.append(rows if rows is not None else stack(parts, dtype))
    return out


class Waiting(OrderedDict):
    """A list of pending tickets in arrival order (E or D) from which any one leaves in O(1): a cancel, a
    deadline or a client gone takes its ticket out of the middle (a deque's remove scanned it: 20,000
    cancels cost 3.8 s)."""

    __slots__ = ()

    def append(self, ticket):
        self[ticket] = None

    def extend(self, tickets):
        for ticket in tickets:
            self[ticket] = None

    def head(self):
        return next(iter(self))

    def popleft(self):
        self.popitem(last=False)


class QueueBase:
    """A queue's state and service rule; `submit` and `cancel` are its whole interface to the server."""

    kind = None

    def __init__(self, decl, name, quota=None):
        self.decl = decl
        self.name = name
        self._capacity = decl.capacity if decl.capacity >= 0 else sys.maxsize
        self._min_after = decl.min_after_dequeue
        self._dtypes = tuple(wire_dtypes.as_numpy(d) for d in decl.dtypes)
        self._ncomp = len(self._dtypes)
        self._shapes = None if decl.shapes is None else tuple(tuple(s) for s in decl.shapes)
        self._quota = quota or Quota()  # the registry's, shared by every queue of the broker
        self._container = decl.container
        self._row_bytes = fixed_row_bytes(self._dtypes, self._shapes)  # None: elements vary, count each
        self.held_bytes = 0  # stored elements + pending enqueues' rest (see quota.py)
        self._closed = False
        self._error = None  # set by fail(): what every dequeue answers from then on (producers.py)
        self._leased = 0  # elements handed out on leases not settled yet (leases.py): held, not stored
        self._lease_acked = self._lease_returned = 0   # leased elements acked, and given back, so far
        self.freed = False
        self._enq = Waiting()  # E
        self._deq = Waiting()  # D
        self._tries = {"enqueue": self._try_enqueue, "enqueue_many": self._try_enqueue_many,
                       "dequeue": self._try_dequeue, "dequeue_many": self._try_dequeue_many,
                       "dequeue_up_to": self._try_dequeue_many, "close": self._try_close}

    # ------------------------------------------------ storage, per kind

    def _take(self):
        """Remove and return one stored element."""
        raise NotImplementedError

    def _restore(self, held):
        """Give back elements a batch dequeue held (FIFO: front, original order)."""
        raise NotImplementedError

    def _check_shape(self, i, shape, batch=None):
        """InvalidArgument unless `shape` fits component i (elements of a batch of `batch`)."""
        expected = self._shapes[i]
        if shape != expected:
            self._shape_mismatch(i, expected, shape, batch)

    def _batch(self, held):
        """The arrays [B]+shape of a batch dequeue of the elements `held`."""
        return [stack([e[i] for e in held], dtype) for i, dtype in enumerate(self._dtypes)]

    def _empty_batch(self):
        return [np.empty((0,) + tuple(d or 0 for d in shape), dtype)
                for shape, dtype in zip(self._shapes, self._dtypes)]

    # ------------------------------------------------ public API

    def submit(self, ticket):
        """Validate and apply one request; return the tickets it completed, in completion order."""
        if ticket.done or ticket._queue is not None:
            raise InvalidArgumentError(f"{ticket!r} was already submitted")
        self._validate(ticket)
        op = ticket.op
        if op in ENQUEUE_OPS:
            n = self._request_bytes(ticket)
            self._quota.charge(self._container, n, self.name)  # ResourceExhausted: refused, nothing changed
            self.held_bytes += n
        if op == "close" and ticket.cancel_pending_enqueues:
            return self._cancelling_close(ticket)
        if op == "enqueue_many" and ticket._batch == 0 or op in BATCH_DEQUEUE_OPS and ticket.n == 0:
            if op != "enqueue_many":
                ticket.result = self._empty_batch()
            ticket.done = True  # never queued, even on a closed queue (§3)
            return [ticket]
        ticket._queue = self
        (self._enq if op in ENQUEUE_OPS or op == "close" else self._deq).append(ticket)
        done = []
        self._run(done)
        return done

    def cancel(self, ticket, error):
        """Withdraw a pending ticket with `error` (deadline, client cancel); [] if it is not pending here."""
        if ticket._queue is not self:
            return []
        del (self._enq if ticket in self._enq else self._deq)[ticket]
        done = [self._withdraw(ticket, error)]
        self._run(done)
        return done

    def cancel_owner(self, owner, error):
        """Withdraw every pending ticket of `owner` (a client that went away), then serve the others."""
        return self._cancel_where(lambda t: t.owner == owner, error)

    def cancel_all(self, error):
        """Withdraw every pending ticket (container reset)."""
        return self._cancel_where(lambda t: True, error)

    def free(self):
        """Give back every byte this queue still holds (the registry freed it, after cancel_all). The elements go
        now: the queue refers to itself (its `_tries`), so it would wait for a full garbage collection."""
        self._release(self.held_bytes)
        self._elements.clear()
        self.freed = True

    def shrink(self):
        """Let go of storage this queue no longer needs; the bytes it took (a kind with storage of its own)."""
        return 0

    def fail(self, error):
        """zmqflow's extension (§8): the queue's input failed. It closes with cancel_pending_enqueues, its
        elements are dropped, and every dequeue, waiting or later, answers `error`, as does any enqueue:
        consumers get the failure, never a quietly short input. The tickets that completed."""
        if self._error is not None:
            return []
        self._error = error
        close = Ticket("close", cancel_pending_enqueues=True)
        done = [t for t in self._cancelling_close(close) if t is not close]
        self._release(self.held_bytes)  # what is left is the stored elements'
        self._elements.clear()
        return done

    def give_back(self, elements):
        """Elements of an unsettled lease return (as a withdrawn batch's do, §5) and wake dequeuers."""
        self._leased -= len(elements)
        self._lease_returned += len(elements)
        if self._error is not None:  # a failed queue holds nothing: they go
            self._release(self._elements_bytes(elements))
            return []
        self._restore(elements)
        done = []
        self._run(done)
        return done

    def take_back(self, ticket):
        """A plain dequeue whose answer could not be delivered (its client is gone): the elements it took
        return as a withdrawn batch's do (§5) and are held again; the tickets that completes."""
        held, ticket.handed = ticket.handed, None
        if not held or self.freed or self._error is not None:  # a freed or failed queue holds nothing again
            return []
        n = self._elements_bytes(held)
        self.held_bytes += n
        self._quota.hold_again(self._container, n)
        self._restore(held)
        done = []
        self._run(done)
        return done

    def settle(self, elements):
        """Elements of an acknowledged lease leave for good. On a closed queue, dequeuers that waited
        for them to maybe come back may now fail OutOfRange: the tickets completed."""
        self._leased -= len(elements)
        self._lease_acked += len(elements)
        self._release(self._elements_bytes(elements))
        done = []
        if self._closed and self._deq:
            self._run(done)
        return done

    def size(self):
        return len(self._elements)

    def is_closed(self):
        return self._closed

    def describe(self):
        d = self.decl
        return {"kind": self.kind, "name": self.name, "capacity": d.capacity, "size": len(self._elements),
                "closed": self._closed, "dtypes": list(d.dtypes),
                "shapes": None if d.shapes is None else [list(s) for s in d.shapes],
                "names": None if d.names is None else list(d.names), "min_after_dequeue": d.min_after_dequeue,
                "waiting_enqueues": len(self._enq), "waiting_dequeues": len(self._deq), "bytes": self.held_bytes,
                "leased": self._leased, "lease_acked": self._lease_acked, "lease_returned": self._lease_returned}

    def __repr__(self):
        return f"<{self.kind} {self.name!r} size={len(self._elements)} closed={self._closed}>"

    # ------------------------------------------------ validation (§3)

    def _validate(self, t):
        op = t.op
        if type(op) is not str or op not in OPS:
            raise InvalidArgumentError(f"unknown queue operation {op!r:.60}")
        comps = t.components
        if op in ENQUEUE_OPS:
            self._validate_enqueue(t, comps, op == "enqueue_many")
            return
        if type(comps) not in (list, tuple) or comps:
            raise InvalidArgumentError(f"{op} takes no tensors")
        if op in BATCH_DEQUEUE_OPS:
            n = t.n
            if type(n) is not int:
                raise InvalidArgumentError(f"{op} needs an int number of elements, got {n!r:.60}")
            if n < 0:
                raise InvalidArgumentError(f"{self.kind} '{self.name}': requested {n} < 0 elements")
            if self._shapes is None:
                raise InvalidArgumentError(f"{self.kind} '{self.name}': dequeue_many and dequeue_up_to require "
                                           "the components to have specified shapes")

    def _validate_enqueue(self, t, comps, many):
        if type(comps) not in (list, tuple) or len(comps) != self._ncomp:
            got = len(comps) if isinstance(comps, (list, tuple)) else type(comps).__name__
            raise InvalidArgumentError(f"{self.kind} '{self.name}' expects {self._ncomp} components, got {got}")
        batch = None
        for i, (c, dtype) in enumerate(zip(comps, self._dtypes)):
            if not isinstance(c, np.ndarray):
                raise InvalidArgumentError(f"component {i} must be an array, got {type(c).__name__}")
            if c.dtype != dtype:
                raise InvalidArgumentError(f"Type mismatch in tuple component {i}. Expected "
                                           f"{self.decl.dtypes[i]}, got {wire_dtypes.name_of_or_str(c.dtype)}")
            shape = c.shape
            if many:
                if not shape:
                    raise InvalidArgumentError(f"enqueue_many: component {i} is a scalar; every component needs a "
                                               "batch dimension")
                if batch is None:
                    batch = shape[0]
                elif shape[0] != batch:
                    self._batch_size_mismatch(i, batch, shape)
                shape = shape[1:]
            if self._shapes is not None:
                self._check_shape(i, shape, batch)
        t._batch = batch or 0

    def _batch_size_mismatch(self, i, batch, shape):
        """Component i's dim 0 differs from component 0's B. With declared shapes TF checks [B]+shape per
        component (so the message is the shape mismatch); without, it compares the 0th dimensions."""
        if self._shapes is not None:
            raise InvalidArgumentError(f"Shape mismatch in tuple component {i}. Expected "
                                       f"{format_shape((batch,) + tuple(self._shapes[i]))}, got {format_shape(shape)}")
        raise InvalidArgumentError(f"All input tensors must have the same size in the 0th dimension. "
                                   f"Component 0 has {batch}, component {i} has {shape[0]}")

    def _shape_mismatch(self, i, expected, got, batch):
        if batch is not None:
            expected, got = (batch,) + tuple(expected), (batch,) + tuple(got)
        raise InvalidArgumentError(f"Shape mismatch in tuple component {i}. Expected {format_shape(expected)}, "
                                   f"got {format_shape(got)}")

    # ------------------------------------------------ the service loop (§2)

    def _run(self, done):
        enq, deq, serve = self._enq, self._deq, self._serve
        while True:
            p = serve(enq, done) if enq else False
            if deq and serve(deq, done):
                p = True
            if not p:
                return

    def _serve(self, lst, done):
        tries, progress = self._tries, False
        while lst:
            t = lst.head()
            res = tries[t.op](t)
            if res != COMPLETE:
                return progress or res == PROGRESS
            lst.popleft()
            t._queue = None
            t.done = True
            done.append(t)
            progress = True
        return progress

    def _withdraw(self, t, error):
        """Finish a ticket already removed from its list: restore what it held (§5)."""
        if t.op in ENQUEUE_OPS:
            self._release(self._request_bytes(t))
        if t._held:
            self._restore(t._held)
        t._held = None
        t._queue = None
        t.error = error
        t.done = True
        return t

    def _cancel_where(self, pred, error):
        done = []
        for lst in (self._enq, self._deq):
            mine = [t for t in lst if pred(t)]
            if not mine:
                continue
            keep = [t for t in lst if not pred(t)]
            lst.clear()
            lst.extend(keep)
            for t in reversed(mine):  # latest first, so FIFO restores end up in original order
                self._withdraw(t, error)
            done.extend(mine)
        if done and (self._enq or self._deq):
            self._run(done)
        return done

    # ------------------------------------------------ try() per op (§3)

    def _closed_error(self):
        return self._error or CancelledError(f"{self.kind} '{self.name}' is closed.")

    def _try_enqueue(self, t):
        if self._closed:
            t.error = self._closed_error()
            self._release(self._request_bytes(t))
            return COMPLETE
        if len(self._elements) < self._capacity:
            self._elements.append(tuple(t.components))
            return COMPLETE
        return NO_PROGRESS

    def _try_enqueue_many(self, t):
        if self._closed:
            t.error = self._closed_error()  # elements already inserted stay
            self._release(self._request_bytes(t))
            return COMPLETE
        elements, i, batch = self._elements, t._next, t._batch
        end = min(batch, i + self._capacity - len(elements))
        if end <= i:
            return NO_PROGRESS
        self._store_rows(t.components, i, end)
        t._next = end
        return COMPLETE if end == batch else PROGRESS

    def _try_dequeue(self, t):
        elements = self._elements
        if self._error is not None:
            t.error = self._error
            return COMPLETE
        if self._closed:
            if not elements:
                if self._leased:
                    return NO_PROGRESS  # a lease may give elements back (closed-queue rule, leases.py)
                t.error = self._insufficient(1, 0)
                return COMPLETE
        elif len(elements) <= self._min_after:
            return NO_PROGRESS
        element = self._take()
        t.result = list(element)
        if t.lease is not None:
            t.leased = [element]
            self._leased += 1
        else:
            t.handed = [element]
            self._release(self._row_bytes if self._row_bytes is not None else self._elements_bytes((element,)))
        return COMPLETE

    def _store_rows(self, components, start, end):
        """Store rows start..end of an enqueue_many: per-element views of the message (no copy)."""
        self._elements.extend(zip(*(rows_of(c[start:end]) for c in components)))

    def _take_many(self, k):
        """Take k elements for one batch."""
        take = self._take
        return [take() for _ in range(k)]

    def _try_dequeue_many(self, t):
        elements, held = self._elements, t._held
        have = len(held) if held else 0
        need = t.n - have
        size = len(elements)
        if self._error is not None:
            if held:
                self._restore(held)
                t._held = None
            t.error = self._error
            return COMPLETE
        if self._closed and size < need and not (t.op == "dequeue_many" and size + self._leased >= need):
            if held:
                self._restore(held)
                t._held = None
            if t.op == "dequeue_up_to" and len(elements) > 0:
                return self._complete_batch(t, self._take_many(len(elements)))
            if t.op == "dequeue_up_to" and self._leased:
                return NO_PROGRESS  # leased elements may come back (closed-queue rule, leases.py)
            t.error = self._insufficient(need, size)
            return COMPLETE
        k = min(size - (0 if self._closed else self._min_after), need)
        if k <= 0:
            return NO_PROGRESS
        if not have and k == need:  # the whole batch at once, the common case
            return self._complete_batch(t, self._take_many(k))
        if held is None:
            held = t._held = []
        held.extend(self._take_many(k))
        if k < need:
            return PROGRESS
        t._held = None
        return self._complete_batch(t, held)

    def _complete_batch(self, t, held):
        """Stack the batch; if it cannot be built (memory, size limit) give the elements back."""
        try:
            t.result = self._batch(held)
        except (MemoryError, ValueError) as e:
            self._restore(held)
            t.error = ResourceExhaustedError(f"{self.kind} '{self.name}': a batch of {len(held)} elements could "
                                             f"not be assembled: {e}")
            return COMPLETE
        if t.lease is not None:
            t.leased = held
            self._leased += len(held)
        else:
            t.handed = held
            self._release(self._elements_bytes(held))
        return COMPLETE

    def _try_close(self, t):
        if self._closed:
            t.error = CancelledError(f"Queue '{self.name}' is already closed.")
        self._closed = True
        return COMPLETE

    def _insufficient(self, requested, size):
        return OutOfRangeError(f"{self.kind} '{self.name}' is closed and has insufficient elements "
                               f"(requested {requested}, current size {size})")

    def _cancelling_close(self, t):
        """close(cancel_pending_enqueues=True): never queued; fails every pending E request (§3)."""
        self._closed = True
        done = []
        for e in self._enq:
            self._release(self._request_bytes(e))
            e._queue = None
            e.error = self._error or CancelledError("Enqueue operation was cancelled")
            e.done = True
            done.append(e)
        self._enq.clear()
        t.done = True
        done.append(t)
        self._run(done)
        return done

    # ------------------------------------------------ bytes held (quota.py)

    def _request_bytes(self, t):
        """Bytes of what an enqueue has not inserted yet (all of it for `enqueue`)."""
        overhead = element_overhead(len(self._dtypes))
        if t.op == "enqueue":
            return self._row_bytes if self._row_bytes is not None else sum(map(nbytes, t.components)) + overhead
        rest = t._batch - t._next
        if self._row_bytes is not None or not rest:
            return rest * (self._row_bytes or 0)
        return sum(nbytes(c[t._next:]) for c in t.components) + rest * overhead

    def _elements_bytes(self, elements):
        if self._row_bytes is not None:
            return len(elements) * self._row_bytes
        return sum(nbytes(c) for e in elements for c in e) + len(elements) * element_overhead(len(self._dtypes))

    def _release(self, n):
        if n:
            self.held_bytes -= n
            self._quota.release(self._container, n)
