"""A leased dequeue's answer on the client: the elements, and the lease to settle them with.

    with queue.dequeue_many(100, lease=30) as batch:   # acked when the block ends,
        train(batch)                                    # nacked (given back) if it raises

    leased = queue.dequeue_many(100, lease=30)          # or settle it yourself
    leased.extend(60)                                   # a long step keeps its batch
    leased.ack()

Until it is acknowledged the broker keeps the batch; if this client dies, says
`bye`, nacks, or lets the lease expire, the elements go back to the queue for
another consumer (at least once). A lease belongs to the client socket that took
it, and a queue object has one socket per thread: settle a lease in the thread
that dequeued it (another thread's ack is PermissionDeniedError).
"""

import logging

from zmqflow.common.errors import OpError
from zmqflow.common.wire.protocol import BrokerOps

log = logging.getLogger(__name__)

SETTLE_TIMEOUT = 10.0
"""Seconds an ack, nack or extend waits for the broker."""


class Lease:
    """`values` (what the plain dequeue returns) held by the broker until `ack()`."""

    def __init__(self, queue, result, values):
        self.queue = queue
        self.id = result["lease"]
        self.seconds = result["lease_s"]
        self.values = values
        self.settled = False

    def _call(self, op, args, timeout):
        return self.queue._client.call(op(self.id, **args), timeout=timeout)[0]

    def ack(self, timeout=SETTLE_TIMEOUT):
        """The elements are processed: the broker drops them for good. An expired lease raises
        FailedPreconditionError (its elements went back and may reach another consumer)."""
        self.settled = True
        return self._call(BrokerOps.Ack, {}, timeout)

    def ack_async(self, timeout=SETTLE_TIMEOUT):
        """ack() sent now, its answer collected later with `.result()` (which raises what ack() would).
        A request this thread sends next reaches the broker after it, with no round trip between."""
        self.settled = True
        return self.queue._client.submit(BrokerOps.Ack(self.id), timeout=timeout)

    def nack(self, timeout=SETTLE_TIMEOUT):
        """The elements could not be processed: back to the queue at once, for any consumer."""
        self.settled = True
        return self._call(BrokerOps.Nack, {}, timeout)

    def extend(self, seconds=None, timeout=SETTLE_TIMEOUT):
        """Keep the lease `seconds` (default: its own length) from now."""
        answer = self._call(BrokerOps.Extend, {"seconds": self.seconds if seconds is None else seconds}, timeout)
        self.seconds = answer["lease_s"]
        return answer

    def __enter__(self):
        return self.values

    def __exit__(self, kind, error, traceback):
        if self.settled:
            return False
        if kind is None:
            self.ack()
            return False
        try:
            self.nack()
        except OpError as failed:  # expired or client gone: the elements went back anyway
            log.warning("lease %s not nacked (%s); the block's own error follows", self.id, failed)
        return False

    def __repr__(self):
        return f"<Lease {self.id} {self.seconds:g} s on {self.queue.name!r}{' settled' if self.settled else ''}>"
