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
import time

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
        self.kept_at = time.monotonic()  # when it was granted or last extended (keep)

    def _call(self, op, args, timeout):
        return self.queue._client.call(op(self.id, **args), timeout=timeout)[0]

    def ack(self, timeout=SETTLE_TIMEOUT):
        """The elements are processed: the broker drops them for good. An expired lease raises
        FailedPreconditionError (its elements went back and may reach another consumer)."""
        self.settled = True
        return self._call(BrokerOps.Ack, {}, timeout)

    def nack(self, timeout=SETTLE_TIMEOUT):
        """The elements could not be processed: back to the queue at once, for any consumer."""
        self.settled = True
        return self._call(BrokerOps.Nack, {}, timeout)

    def extend(self, seconds=None, timeout=SETTLE_TIMEOUT):
        """Keep the lease `seconds` (default: its own length) from now."""
        answer = self._call(BrokerOps.Extend, {"seconds": self.seconds if seconds is None else seconds}, timeout)
        self.seconds = answer["lease_s"]
        return answer

    def keep(self, after, seconds=None):
        """Extend the lease (`seconds`, default its own length) once `after` s passed since it was granted or
        last kept: for a holder that works on its elements a while. An expired lease is only logged: its
        elements went back to the queue and come again (at least once)."""
        now = time.monotonic()
        if now - self.kept_at <= after:
            return
        self.kept_at = now
        try:
            self.extend(seconds)
        except OpError as exc:
            log.warning("lease %s not extended (%s): its elements went back and come again", self.id, exc)

    def settle(self, ack):
        """ack() (or nack()) for a holder that cannot act on a failure; whether it was settled. One that fails
        is logged: the lease expired or its client was lost, so its elements went back to the queue anyway."""
        try:
            (self.ack if ack else self.nack)()
            return True
        except OpError as exc:
            log.warning("lease %s of %d elements not %s (%s): they went back to the queue and come again",
                        self.id, rows(self.values), "acked" if ack else "nacked", exc)
            return False

    def __enter__(self):
        return self.values

    def __exit__(self, kind, error, traceback):
        if self.settled:
            return False
        if kind is None:
            self.ack()
        else:
            self.settle(ack=False)  # the block's own error follows
        return False

    def __repr__(self):
        return f"<Lease {self.id} {self.seconds:g} s on {self.queue.name!r}{' settled' if self.settled else ''}>"


def rows(values):
    """Rows of a dequeued batch (a dict or list of components, or one array); 1 for one element."""
    if isinstance(values, dict):
        values = next(iter(values.values()))
    elif isinstance(values, (list, tuple)):
        values = values[0]
    return len(values) if getattr(values, "ndim", 1) else 1
