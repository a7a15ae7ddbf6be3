"""Fake members for aggregator tests: tiny services in threads that answer after a delay, never, or with an error.

Their output depends on the input (x[:, :1] + offset in every column), so an answer mixed into
the wrong request is visible. The delay (seconds, or a function of x), mode and offset can be
changed while they run. With `service_s` a member is a server of fixed capacity: one request at
a time, `service_s` each, in arrival order (1 / service_s answers per second, queueing beyond).
"""

import heapq
import threading
import time

import numpy as np

from zmqflow.common.errors import UnavailableError
from zmqflow.common.rpc.service import PARKED, Service


class FakeMember(Service):
    name = "fake-member"

    def __init__(self, offset=0.0, delay=0.0, mode="answer", classes=3, service_s=0.0):
        super().__init__("tcp://127.0.0.1:*", client_timeout=5.0)
        self.offset, self.delay, self.mode, self.classes = offset, delay, mode, classes
        self.service_s, self._free_at = service_s, 0.0  # fixed capacity: when the request before is done
        self.seen = 0
        self._answers = []  # heap of (when, seq, call, out): delayed answers, sent by _expire when due
        self.handlers["predict"] = self._predict
        self._thread = threading.Thread(target=self.run, kwargs={"install_signals": False}, daemon=True)

    def start(self):
        self._thread.start()
        return self

    def shutdown(self):
        self.stop()
        self._thread.join(5)

    def expected(self, x):
        return np.repeat(x[:, :1], self.classes, axis=1).astype(np.float32) + np.float32(self.offset)

    def _predict(self, call):
        self.seen += 1
        if self.mode == "error":
            raise UnavailableError("fake member is failing")
        if self.mode == "never":
            return PARKED  # held, never answered
        out = self.expected(call.tensors[0])
        delay = self.delay(call.tensors[0]) if callable(self.delay) else self.delay
        if self.service_s > 0:  # queued behind the requests before it, then served for service_s
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + self.service_s
            delay = max(delay, self._free_at - now)
        if delay <= 0:
            return {"model": "fake"}, [out]
        when = time.monotonic() + delay
        self._seq += 1
        heapq.heappush(self._answers, (when, self._seq, call, out))
        self.wake_at(when)  # the loop runs _expire then
        return PARKED

    def on_deadline(self, call):
        """A member that ignores its callers' deadlines: the aggregator must enforce its own."""

    def _expire(self, now):
        super()._expire(now)
        while self._answers and self._answers[0][0] <= now:  # the delay is over: answer, however late
            _, _, call, out = heapq.heappop(self._answers)
            self.reply(call, {"model": "fake"}, [out])
