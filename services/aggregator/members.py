"""Member health and choice, without sockets.

A member that fails `unhealthy_after` times in a row (timeouts, or errors that are its own
fault), or whose connection drops, is marked unhealthy: requests skip it and it is probed
every `probe_s` seconds until a probe is answered, which takes it back. Timeouts (and
refusals for load) say a member is busy, not broken: they never eject one of the last
`min_healthy` healthy members, so an overload cannot empty the set (errors and dropped
connections still do). Replica mode sends each request to the
healthy member with the fewest requests outstanding (ties rotate, so equal members share).
The counters are a plain dict per member, easy to list or export. What is in flight to a
member (`inflight`, `outstanding`) is kept by the fan-out policy (fanout.py), which alone
sends and settles requests.
"""

import itertools

from zmqflow.common.errors import AlreadyExistsError, InvalidArgumentError, NotFoundError, check_int
from zmqflow.services.aggregator.admission import BusyRate

COUNTERS = ("requests", "answers", "timeouts", "errors", "probes", "recoveries", "busy")


class Member:
    """One model server as the aggregator sees it: its health record and the requests in flight to it."""

    __slots__ = ("address", "weight", "healthy", "consecutive_failures", "outstanding", "counters",
                 "last_failure", "next_probe_at", "inflight", "probe_rid", "connected_to", "pace")

    def __init__(self, address, weight=1.0):
        self.address, self.weight = address, float(weight)
        self.healthy = True
        self.consecutive_failures = 0
        self.outstanding = 0
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.last_failure = None
        self.next_probe_at = None
        self.inflight = {}  # member-side request id -> the Gather or Probe awaiting its reply (fanout.py)
        self.probe_rid = None  # the id of the probe in flight, if any
        self.connected_to = None  # the address its host name resolved to, once connected (server.py)
        self.pace = BusyRate()  # answers per busy second, for admission (admission.py)

    def describe(self):
        return {"address": self.address, "connected_to": self.connected_to, "weight": self.weight, "healthy": self.healthy,
                "outstanding": self.outstanding, "consecutive_failures": self.consecutive_failures,
                "last_failure": self.last_failure, **self.counters}


class MemberSet:
    def __init__(self, unhealthy_after=3, probe_s=0.5, min_healthy=1):
        check_int("unhealthy_after", unhealthy_after, 1)
        if not probe_s > 0:
            raise InvalidArgumentError(f"probe interval must be > 0 s, got {probe_s!r}")
        check_int("min_healthy", min_healthy)
        self.unhealthy_after, self.probe_s, self.min_healthy = unhealthy_after, probe_s, min_healthy
        self.members = {}  # address -> Member, in the order added
        self._turn = itertools.count()

    def __len__(self):
        return len(self.members)

    def __contains__(self, address):
        return address in self.members

    def get(self, address):
        return self.members.get(address)

    def add(self, address, weight=1.0):
        if not isinstance(address, str) or not address:
            raise InvalidArgumentError(f"member address must be a non-empty string, got {address!r:.80}")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
            raise InvalidArgumentError(f"member weight must be a number >= 0, got {weight!r:.80}")
        if address in self.members:
            raise AlreadyExistsError(f"{address} is already a member")
        member = self.members[address] = Member(address, weight)
        return member

    def remove(self, address):
        member = self.members.pop(address, None)
        if member is None:
            raise NotFoundError(f"{address} is not a member; members: {', '.join(self.members) or 'none'}")
        return member

    def healthy(self):
        return [m for m in self.members.values() if m.healthy]

    def unhealthy(self):
        return [m for m in self.members.values() if not m.healthy]

    def least_outstanding(self, exclude=()):
        """The healthy member with the fewest outstanding requests (ties rotate), or None."""
        candidates = [m for m in self.members.values() if m.healthy and m.address not in exclude]
        if not candidates:
            return None
        start = next(self._turn) % len(candidates)
        rotated = candidates[start:] + candidates[:start]
        return min(rotated, key=lambda m: m.outstanding)

    # ------------------------------------------------ outcomes

    def sent(self, member):
        member.counters["requests"] += 1

    def answered(self, member):
        member.counters["answers"] += 1
        member.consecutive_failures = 0

    def failed(self, member, kind, reason, now, counts=True, busy=False):
        """A request to `member` timed out or failed (`kind`: timeouts|errors). True if it just became unhealthy.
        A `busy` failure (a timeout, a refusal for load) never takes the healthy below `min_healthy`."""
        member.counters[kind] += 1
        member.last_failure = reason
        if not counts:
            return False
        member.consecutive_failures += 1
        if busy and member.healthy and len(self.healthy()) <= self.min_healthy:
            return False
        if member.healthy and member.consecutive_failures >= self.unhealthy_after:
            member.healthy = False
            member.next_probe_at = now + self.probe_s
            return True
        return False

    def disconnected(self, member, now):
        """Its connection dropped: unhealthy at once, whatever its record. True if it just became so."""
        member.last_failure = "disconnected"
        if not member.healthy:
            return False
        member.healthy = False
        member.next_probe_at = now + self.probe_s
        return True

    def unresolved(self, member, now, error=None):
        """Its host name does not resolve (yet): unhealthy, and looked up again at its next probe, `probe_s`
        from now. True if it just became unhealthy."""
        member.last_failure = "name does not resolve" + (f" ({error})" if error else "")
        member.next_probe_at = now + self.probe_s
        if not member.healthy:
            return False
        member.healthy = False
        return True

    # ------------------------------------------------ probes

    def probes_due(self, now):
        return [m for m in self.members.values() if not m.healthy and m.next_probe_at <= now]

    def probe_sent(self, member, now):
        member.counters["probes"] += 1
        member.next_probe_at = now + self.probe_s

    def next_probe_at(self):
        times = [m.next_probe_at for m in self.members.values() if not m.healthy]
        return min(times) if times else None

    def recovered(self, member):
        """A probe was answered: take the member back."""
        if not member.healthy:
            member.healthy = True
            member.consecutive_failures = 0
            member.next_probe_at = None
            member.counters["recoveries"] += 1
