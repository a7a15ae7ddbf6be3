"""A producer's registration on a broker queue: the broker closes the queue when the last producer is
done and fails it when one vanishes (docs/queue-semantics.md §8, services/broker/queues/producers.py).

    queue = queues.attach("train", broker=endpoint, role="producer", lease=3.5)
    producer = queue.producer         # or Producer(queue, lease=3.5) for a queue opened with a declaration
    producer.beat({"reading": ["a.csv"], "instances": 1200})   # at least once a lease, better every lease / 4
    producer.done(exhausted=True)     # the last producer done closes the queue: consumers get OutOfRange
    producer.fail(error)              # consumers get `error` instead of the rest of the input

The registration belongs to the connection it was made on: the broker watches that connection (its
drop is the producer vanishing) and the beats (none within the lease is the producer vanishing). So a
Producer has a connection of its own for its whole life, used from any thread under a lock; the
queue's elements go through the queue object's per-thread connections as ever.
"""

import itertools
import os
import socket
import threading

from zmqflow.common.errors import ABORTED, OUT_OF_RANGE, error_from_code
from zmqflow.common.wire.protocol import BrokerOps
from zmqflow.common.rpc.client import RpcClient

DEFAULT_LEASE_S = 3.5
"""A producer silent this long is gone: consumers learn it within the lease."""
DEFAULT_REJOIN_S = 30.0
"""At-least-once: how long a queue whose producers are all gone waits for one to register again."""
CALL_TIMEOUT = 10.0

_IN_PROCESS = itertools.count(1)


def producer_name(prefix="producer"):
    """'prefix@host:pid', then 'prefix@host:pid#2', ... for more in one process: unique across hosts and
    restarts, and it says where to look when the broker names it in an error."""
    n = next(_IN_PROCESS)
    return f"{prefix}@{socket.gethostname()}:{os.getpid()}" + (f"#{n}" if n > 1 else "")


class Producer:
    """This process's registration as a producer of `queue`; `state` is the broker's last answer
    (closed None, 'ok' or 'failed', its error, every producer's progress)."""

    def __init__(self, queue, lease=DEFAULT_LEASE_S, name=None, at_least_once=False, rejoin_s=None, source=None,
                 timeout=CALL_TIMEOUT):
        self.queue, self.lease_s, self.timeout = queue, lease, timeout
        self.name = name or producer_name()
        self._lock = threading.Lock()
        self._rpc = RpcClient(queue.broker, name="producer")
        try:
            self._call(BrokerOps.RegisterProducer, at_least_once=bool(at_least_once), rejoin_s=rejoin_s,
                       source=None if source is None else source.handle)
        except BaseException:
            self.close()
            raise
        self.first = self.state["first"] == self.name
        """The queue's first producer (a reader pipeline's feeds the file names)."""

    @property
    def closed(self):
        """None while the input goes on, 'ok' once the queue was closed after its producers, 'failed'."""
        return self.state["closed"]

    def error(self):
        """The queue's failure as the exception its consumers get, or None."""
        return error_from_code(self.state["code"], self.state["error"]) if self.closed == "failed" else None

    def beat(self, progress=None):
        """Alive, with `progress` (a JSON-able dict; `reading`, `instances` and `files_done` are named when
        the broker reports this producer gone); the queue's state."""
        return self._call(BrokerOps.Beat, progress=progress)

    def done(self, exhausted=True, progress=None):
        """Every element of this producer is in (`exhausted`: it saw its input's end, not a stop)."""
        return self._call(BrokerOps.ProducerDone, exhausted=bool(exhausted), progress=progress)

    def fail(self, error):
        """Fail the queue with `error` (an OpError keeps its code; anything else, and an end of input that
        came as an error, OutOfRange, is Aborted: the broker refuses a failure that reads as the end)."""
        code = getattr(error, "code", ABORTED)
        return self._call(BrokerOps.ProducerFailed, code=ABORTED if code == OUT_OF_RANGE else code,
                          error=str(error) or type(error).__name__)

    def close(self):
        """Let go of the connection (after done, fail, or to leave as a vanished producer would)."""
        with self._lock:
            if self._rpc is not None:
                self._rpc.close()
                self._rpc = None

    def _call(self, request, **args):
        with self._lock:
            self.state = self._rpc.call(request(queue=self.queue.handle, name=self.name, lease=self.lease_s, **args),
                                        timeout=self.timeout)[0]
            return self.state

    def __repr__(self):
        return f"<Producer {self.name} of {self.queue.name!r} ({self.closed or 'open'})>"
