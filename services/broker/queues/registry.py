"""Every queue of the broker, by handle and by (container, shared_name) (§1, §7).

A handle is an int the broker hands out once and never reuses, so a request
naming a queue of a reset container gets NotFound instead of reaching a new
queue that happens to share its name.
"""

import itertools
from collections import Counter

from zmqflow.common.errors import CancelledError, NotFoundError
from zmqflow.services.broker.queues.fifo import FIFOQueue
from zmqflow.services.broker.queues.padding_fifo import PaddingFIFOQueue
from zmqflow.services.broker.queues.quota import Quota
from zmqflow.services.broker.queues.random_shuffle import RandomShuffleQueue

QUEUE_CLASSES = {cls.kind: cls for cls in (FIFOQueue, RandomShuffleQueue, PaddingFIFOQueue)}


class QueueRegistry:
    """Creates, attaches to, finds and frees queues."""

    def __init__(self, limits=None):
        self.quota = Quota(limits)  # queue counts, capacities, bytes held (quota.py)
        self._counts = Counter()  # container -> number of queues
        self._queues = {}  # handle -> queue
        self._where = {}  # handle -> (container, shared_name)
        self._by_name = {}  # (container, shared_name) -> handle, shared queues only
        self._handles = itertools.count(1)

    def open(self, decl):
        """(handle, created): attach to the compatible queue of that name, or create one.

        An empty shared_name always creates a private queue. An incompatible
        declaration raises InvalidArgument and leaves the existing queue alone.
        """
        decl.validate()
        key = (decl.container, decl.shared_name)
        if decl.shared_name and key in self._by_name:
            handle = self._by_name[key]
            decl.check_compatible(self._queues[handle].decl)
            return handle, False
        self.quota.check_new_queue(decl, len(self._queues), self._counts[decl.container])
        handle = next(self._handles)
        name = decl.shared_name or f"queue-{handle}"
        self._queues[handle] = QUEUE_CLASSES[decl.kind](decl, name, self.quota)
        self._counts[decl.container] += 1
        self._where[handle] = key
        if decl.shared_name:
            self._by_name[key] = handle
        return handle, True

    def find(self, container, shared_name):
        """The handle of the shared queue of that name, or NotFound (attach without a declaration)."""
        handle = self._by_name.get((container, shared_name))
        if handle is None:
            raise NotFoundError(f"no queue named {shared_name!r:.80} in container {container!r:.80}")
        return handle

    def get(self, handle):
        """The queue of `handle` (an int: the protocol's declarations check it on the wire)."""
        queue = self._queues.get(handle)
        if queue is None:
            raise NotFoundError(f"queue {handle!r:.40} not found: never created or its container was reset")
        return queue

    def reset(self, container):
        """Free every queue of `container`; their pending requests complete Cancelled (returned)."""
        done = []
        for handle in [h for h, (c, _) in self._where.items() if c == container]:
            queue = self._queues.pop(handle)
            key = self._where.pop(handle)
            self._by_name.pop(key, None)
            self._counts[container] -= 1
            done.extend(queue.cancel_all(CancelledError(
                f"{queue.kind} '{queue.name}' was freed: container '{container}' was reset")))
            queue.free()
        return done

    def shrink(self):
        """Let go of the storage queues no longer need (closed and drained); the bytes it took."""
        return sum(queue.shrink() for queue in self._queues.values())

    def cancel_owner(self, owner, error):
        """Withdraw every pending request of `owner` on every queue (client gone)."""
        done = []
        for queue in list(self._queues.values()):
            done.extend(queue.cancel_owner(owner, error))
        return done

    def list(self):
        return [{"handle": h, "container": c, "shared_name": s, **self._queues[h].describe()}
                for h, (c, s) in self._where.items()]

    def __len__(self):
        return len(self._queues)
