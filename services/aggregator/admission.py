"""Admission control without sockets: may one more request go to a member and still be answered in time?

Why: under overload a member's queue grows until every request waits past its deadline; the
aggregator then timed out everything, ejected every member and answered 'no healthy member'.
Instead each member's pace is measured (`BusyRate`: answers per second of the time it had
requests in flight, decayed over about a second) and, by Little's law, a member with `n`
requests in flight answers a new one in about (n + 1) / pace seconds. A member is admitted
while that fits in `share` of the time the request has left; otherwise it is busy. A request
that cannot get enough members is shed at once with RESOURCE_EXHAUSTED and a retry hint (how
long the least busy member needs to get back under its bound), instead of timing out later.

`min_inflight` requests are always admitted, so an idle or unmeasured member is never refused
and a burst after a quiet spell is not shed on a stale pace.
"""

import math
import time

from zmqflow.common.errors import InvalidArgumentError, check_int


class BusyRate:
    """Answers per busy second (time with at least one request in flight), exponentially decayed over `tau_s`."""

    __slots__ = ("tau_s", "answers", "busy_s", "inflight", "last", "clock")

    MIN_BUSY_S = 0.02  # below this much busy time the pace is unknown

    def __init__(self, tau_s=1.0, clock=time.monotonic):
        self.tau_s, self.clock = tau_s, clock
        self.answers = self.busy_s = 0.0
        self.inflight = 0
        self.last = None

    def _advance(self):
        now = self.clock()
        if self.last is not None:
            decay = math.exp(-max(0.0, now - self.last) / self.tau_s)
            self.answers *= decay
            # busy all along since the last event: that stretch, decayed as it passed (exact for any step)
            self.busy_s = self.busy_s * decay + (self.tau_s * (1.0 - decay) if self.inflight else 0.0)
        self.last = now

    def started(self):
        """A request went out to the member."""
        self._advance()
        self.inflight += 1

    def settled(self, answered):
        """A request to the member is no longer awaited (`answered`: it answered, so it counts for the pace)."""
        self._advance()
        self.inflight = max(0, self.inflight - 1)
        if answered:
            self.answers += 1.0

    def per_second(self):
        """Answers per busy second, or None while too little busy time was seen to tell."""
        self._advance()
        return self.answers / self.busy_s if self.busy_s >= self.MIN_BUSY_S else None


class Admission:
    """Whether a member may take one more request with `budget_s` left before the request's deadline."""

    def __init__(self, share=0.5, min_inflight=4):
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
            raise InvalidArgumentError(f"admission share must be a number in [0, 1] (0: never shed), got {share!r:.80}")
        check_int("min_inflight", min_inflight, 1)
        self.share, self.min_inflight = float(share), min_inflight

    @property
    def enabled(self):
        return self.share > 0

    def expected_s(self, outstanding, pace):
        """Seconds until a member with `outstanding` in flight, answering `pace`/s, answers one more (inf: stalled)."""
        return (outstanding + 1) / pace if pace else math.inf

    def admits(self, member, budget_s):
        if not self.enabled or member.outstanding < self.min_inflight:
            return True
        pace = member.pace.per_second()
        return pace is None or self.expected_s(member.outstanding, pace) <= budget_s * self.share

    def retry_after_ms(self, members, budget_s, stalled_s):
        """How long until the least busy of `members` admits again (>= 1 ms); `stalled_s` for a member not answering."""
        waits = []
        for member in members:
            pace = member.pace.per_second()
            excess = self.expected_s(member.outstanding, pace) - budget_s * self.share
            waits.append(stalled_s if math.isinf(excess) else max(0.0, excess))
        return max(1, math.ceil(1000 * min(waits, default=stalled_s)))


class QueueDelay:
    """How long a request waited before the aggregator read it, from the client's wall-clock send time.

    Why: an aggregator busier than its socket can feed reads requests late; judged from when it read them,
    they seem to have their whole deadline left, go out to members, and are answered after the client
    gave up. The clocks of two hosts differ by an unknown offset, so per client the least (arrival - sent)
    of the last one to two `window_s` is taken as no wait at all and the wait is what exceeds it (as
    delay-based congestion control does): a constant offset cancels out.
    """

    def __init__(self, window_s=10.0, max_clients=10_000):
        self.window_s, self.max_clients = window_s, max_clients
        self._least = {}  # client -> [least this window, least the window before, window start]

    def waited(self, client, sent_at, now):
        """Seconds the request sent at `sent_at` (client's clock) waited until `now` (ours), >= 0."""
        gap = now - sent_at
        least = self._least.get(client)
        if least is None or now - least[2] >= self.window_s:
            if least is None and len(self._least) >= self.max_clients:
                self._forget_idle(now)
            least = self._least[client] = [gap, gap if least is None else least[0], now]
        least[0] = min(least[0], gap)
        return max(0.0, gap - min(least[0], least[1]))

    def _forget_idle(self, now):
        for client in [c for c, least in self._least.items() if now - least[2] >= 2 * self.window_s]:
            del self._least[client]
