"""At-least-once dequeues: elements handed out on a lease stay the broker's until acknowledged.

A leased dequeue answers its elements like any dequeue, but the queue keeps them
(counted against the byte quota, invisible to other consumers, not in `size`)
until the consumer acknowledges the lease. A lease that is not acknowledged
gives its elements back to its queue (FIFO: at the front, in order; shuffle:
anywhere), waking parked dequeuers, when it expires, when its owner nacks it,
or when its owner is gone (connection dropped, `bye`, silent past the client
timeout while it waited for a request).
So a consumer killed in the middle of a batch loses nothing: someone else gets
the batch again (at least once, not exactly once).

Closed queues: leased elements may still come back, so a closed queue does not
answer OutOfRange while they could serve a request: dequeue and dequeue_many wait
while stored + leased elements cover what they still need (and fail at once when
even that is not enough); dequeue_up_to returns the stored elements when there are
any and waits only while none are stored and some are leased. An ack that ends the
last hope fails the waiters then (QueueBase.settle).

A lease belongs to the client that took it: settling it from another client
is PermissionDenied. Settled leases are remembered (the last `MEMORY` of them),
so acking one twice or after it expired says what happened to it.
Plain logic, no sockets: the server maps ack / nack / extend and lost clients
to these calls and answers the tickets they complete.
"""

import heapq
import itertools
from collections import OrderedDict

from zmqflow.common.errors import FailedPreconditionError, NotFoundError, PermissionDeniedError

_COMPACT_MIN = 1024  # expiry entries kept before the heap is rebuilt without settled leases' entries

MEMORY = 10_000
"""Settled leases remembered, to tell a late or repeated ack what became of its lease."""


class Lease:
    """Elements of one dequeue that `owner` has not acknowledged yet."""

    __slots__ = ("id", "queue", "owner", "elements", "seconds", "expires")

    def __init__(self, lease_id, queue, owner, elements, seconds, expires):
        self.id, self.queue, self.owner, self.elements = lease_id, queue, owner, elements
        self.seconds, self.expires = seconds, expires


class LeaseBook:
    """Every open lease of a broker, by id, with the counts its metrics export."""

    def __init__(self):
        self._open = {}                  # id -> Lease
        self._settled = OrderedDict()    # id -> (outcome, sentence), the last MEMORY of them
        self._expiries = []              # heap of (expires, id); stale entries skipped
        self._ids = itertools.count(1)
        self.counts = {"leases": 0, "leased": 0, "acked": 0, "expired": 0, "nacked": 0, "client_gone": 0}

    def __len__(self):
        return len(self._open)

    @property
    def next_expiry(self):
        """When the earliest open lease expires (monotonic s), None without any."""
        heap = self._expiries
        while heap and (heap[0][1] not in self._open or self._open[heap[0][1]].expires != heap[0][0]):
            heapq.heappop(heap)  # settled or extended since
        return heap[0][0] if heap else None

    def grant(self, queue, owner, elements, seconds, now):
        """A new lease on `elements`, which `queue` already counts as leased out."""
        lease = Lease(next(self._ids), queue, owner, elements, seconds, now + seconds)
        self._open[lease.id] = lease
        self._schedule(lease)
        self.counts["leases"] += 1
        self.counts["leased"] += len(elements)
        return lease

    # ------------------------------------------------ the owner settles

    def ack(self, lease_id, owner):
        """Drop the lease's elements for good; (lease, tickets the queue completed)."""
        lease = self._take(lease_id, owner)
        self.counts["acked"] += len(lease.elements)
        self._remember(lease, "acked", "was already acknowledged")
        return lease, lease.queue.settle(lease.elements)

    def nack(self, lease_id, owner):
        """Give the lease's elements back to its queue at once; (lease, completed tickets)."""
        lease = self._take(lease_id, owner)
        return lease, self._give_back(lease, "nacked", "was nacked: its elements went back to the queue")

    def extend(self, lease_id, owner, seconds, now):
        """Let the lease run `seconds` from now (a long step keeps its batch)."""
        lease = self._find(lease_id, owner)
        lease.seconds, lease.expires = seconds, now + seconds
        self._schedule(lease)
        return lease

    # ------------------------------------------------ the broker takes them back

    def expire(self, now):
        """Give back every lease expired by `now`; the tickets their queues completed."""
        done = []
        while True:
            when = self.next_expiry
            if when is None or when > now:
                return done
            lease = self._open.pop(heapq.heappop(self._expiries)[1])
            done.extend(self._give_back(lease, "expired", f"expired after {lease.seconds:g} s: its "
                                        f"{len(lease.elements)} elements went back to the queue"))

    def give_back_owner(self, owner):
        """Give back every lease of a client that is gone; the tickets their queues completed."""
        done = []
        for lease in [lease for lease in self._open.values() if lease.owner == owner]:
            del self._open[lease.id]
            done.extend(self._give_back(lease, "client_gone", "was given back when its client went away"))
        return done

    def holds(self, owner):
        """Whether `owner` holds an open lease (its connection must stay watched)."""
        return any(lease.owner == owner for lease in self._open.values())

    def forget_freed_queues(self):
        """Drop the leases of queues a container reset freed (their bytes went with the queue)."""
        for lease in [lease for lease in self._open.values() if lease.queue.freed]:
            del self._open[lease.id]
            self._remember(lease, "freed", "is gone: its queue was freed by a container reset")

    def outstanding(self):
        """Elements out on open leases."""
        return sum(len(lease.elements) for lease in self._open.values())

    # ------------------------------------------------ helpers

    def _schedule(self, lease):
        """An entry for the lease's expiry. Settled and extended leases' entries leave lazily, when they reach
        the head; a lease of an hour acked at once would keep its entry an hour, so past twice the open leases
        the heap is rebuilt with the live entries only (amortized O(1))."""
        heap = self._expiries
        heapq.heappush(heap, (lease.expires, lease.id))
        if len(heap) >= max(_COMPACT_MIN, 2 * len(self._open)):
            live = self._open
            heap[:] = [(when, i) for when, i in heap if i in live and live[i].expires == when]
            heapq.heapify(heap)

    def _find(self, lease_id, owner):
        lease = self._open.get(lease_id)
        if lease is None:
            outcome, ended = self._settled.get(lease_id, (None, None))
            if outcome is None:
                raise NotFoundError(f"lease {lease_id} is unknown (never granted, or settled long ago)")
            raise (FailedPreconditionError if outcome == "expired" else NotFoundError)(f"lease {lease_id} {ended}")
        if lease.owner != owner:
            raise PermissionDeniedError(f"lease {lease_id} belongs to another client: only the client that "
                                        "dequeued its elements may settle it")
        return lease

    def _take(self, lease_id, owner):
        lease = self._find(lease_id, owner)
        del self._open[lease_id]
        return lease

    def _give_back(self, lease, reason, ended):
        self.counts[reason] += len(lease.elements)
        self._remember(lease, reason, ended)
        return lease.queue.give_back(lease.elements)

    def _remember(self, lease, outcome, ended):
        self._settled[lease.id] = (outcome, f"{ended} (queue '{lease.queue.name}')")
        if len(self._settled) > MEMORY:
            self._settled.popitem(last=False)
