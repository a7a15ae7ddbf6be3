"""One request to a queue, from arrival to its outcome.

The server builds a Ticket per request and hands it to `QueueBase.submit`; a
ticket that cannot complete yet stays pending inside the queue (it holds no
thread) and finishes on a later submit/cancel. When `done` is set, `result`
(dequeues) or `error` say how it ended. `owner` (the client) and `tag` (the
server's request) are opaque to the queue. A dequeue with `lease` (seconds) leaves
its elements in `leased` when it completes: the queue still holds them (leases.py). Any other dequeue
keeps what it took in `handed` until its answer is sent: a client gone by then gives them back.
__slots__ because a ticket is made for every request on the broker's hot path.
"""

ENQUEUE_OPS = frozenset(("enqueue", "enqueue_many"))
BATCH_DEQUEUE_OPS = frozenset(("dequeue_many", "dequeue_up_to"))
DEQUEUE_OPS = frozenset(("dequeue",)) | BATCH_DEQUEUE_OPS
OPS = ENQUEUE_OPS | DEQUEUE_OPS | {"close"}


class Ticket:
    """A queue request: op and arguments, then done/result/error."""

    __slots__ = ("op", "components", "n", "cancel_pending_enqueues", "owner", "tag", "lease",
                 "done", "result", "error", "leased", "handed",
                 "_queue", "_held", "_next", "_batch")

    def __init__(self, op, components=None, n=None, cancel_pending_enqueues=False, owner=None, tag=None,
                 lease=None):
        self.op = op
        self.components = components if components is not None else []
        self.n = n
        self.cancel_pending_enqueues = cancel_pending_enqueues
        self.owner = owner
        self.tag = tag
        self.lease = lease  # seconds: the dequeued elements stay held until the lease is settled
        self.done = False
        self.result = None
        self.error = None
        self.leased = None  # a completed leased dequeue: the elements it handed out, still held
        self.handed = None  # a completed plain dequeue: the elements it took, until its answer is delivered
        self._queue = None  # the queue whose E or D list holds it while pending
        self._held = None  # dequeue_many/up_to: elements taken so far
        self._next = 0  # enqueue_many: index of the next element to insert
        self._batch = 0  # enqueue_many: B, its number of elements

    @property
    def pending(self):
        return self._queue is not None

    def __repr__(self):
        state = "pending" if self.pending else ("failed" if self.error is not None else "done") if self.done else "new"
        n = f" n={self.n}" if self.n is not None else ""
        return f"<Ticket {self.op}{n} {state}>"
