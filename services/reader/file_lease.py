"""At-least-once file names: a reader thread's lease on the file it reads.

The name stays the broker's until `done()` (after the file's last enqueue_many was
acknowledged); `keep()` extends it while the thread works, so only a reader that died or
stalled past the lease loses it, and then the name goes back to the queue for another
reader (the file is read again: at least once). Called from the thread that took the name:
a lease belongs to the socket that dequeued it.
"""

import logging
import time

from zmqflow.common.errors import OpError

log = logging.getLogger("reader")


class FileLease:
    """The leased file name of one reader thread."""

    def __init__(self, lease):
        self.lease = lease
        self.name = lease.values.item()
        self.period = lease.seconds / 4   # extended as often as the reader beats
        self._kept = time.monotonic()

    def keep(self):
        """Extend the lease when a beat period has passed since the last extension."""
        if time.monotonic() - self._kept < self.period:
            return
        self._kept = time.monotonic()
        try:
            self.lease.extend()
        except OpError as exc:   # expired: the name went back, the file will be read again by someone
            log.warning("file name %s: lease not extended (%s); another reader may read it again", self.name, exc)

    def done(self):
        """The file is in the instance queue: the name is done for good."""
        self._settle(self.lease.ack)

    def give_back(self):
        """The file was not finished (a stop): its name goes back for another reader."""
        self._settle(self.lease.nack)

    def _settle(self, how):
        try:
            how()
        except OpError as exc:   # expired or the broker lost it: the name went back anyway
            log.warning("file name %s not %sed: %s; it went back to the queue and is read again", self.name,
                        how.__name__, exc)
