"""The aggregator's fan-out policy: whom a request goes to, what is in flight, and what replies,
failures, dropped connections and deadlines do to each member's health. No sockets.

The server only moves messages: it asks `ask()` whom to send a client's request to, sends
the frames, and feeds every event back here (a reply, a refusal, a bad answer, a failed
send, a dropped connection, the deadline, a cancel). Each request a member has not settled
yet is in its `inflight` table and counted in its `outstanding`; only `_track` and
`_settle` change them, so the count is exact and never negative.

Rules: `ensemble` asks every healthy member. `replica` asks the healthy one with the fewest
outstanding requests; one that fails fast (an error or a dropped connection, not the
client's own bad input) is replaced by a member not tried yet, while the deadline has not
passed. `unhealthy_after` failures in a row, or a dropped connection, eject a member: it is
skipped, probed every `probe_s` seconds, and taken back when a probe is answered in time;
timeouts never eject one of the last `min_healthy` healthy members (busy is not broken).
A healthy member that would answer too late (admission.py) is skipped as busy; a request left
with fewer members than it needs is shed at once: ResourceExhaustedError with `retry_after_ms`.
"""

import itertools
import logging
import math
import time

from zmqflow.common.errors import (DEADLINE_EXCEEDED, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ResourceExhaustedError,
                                   code_name)
from zmqflow.services.aggregator.admission import Admission
from zmqflow.services.aggregator.gather import Gather
from zmqflow.services.aggregator.members import MemberSet

log = logging.getLogger(__name__)


class Probe:
    """A health probe in flight to an unhealthy member; an answer after `deadline` does not count."""

    __slots__ = ("deadline",)

    def __init__(self, deadline):
        self.deadline = deadline


def _no_wake(when):
    pass


class FanOut:
    """Members, their health and the requests in flight to them; `wake(when)` is called when a
    member is ejected, so the caller runs `probes_due()` by then."""

    def __init__(self, unhealthy_after=3, probe_s=0.5, wake=_no_wake, min_healthy=1, admission=None):
        self.members = MemberSet(unhealthy_after, probe_s, min_healthy)
        self.admission = admission or Admission()
        self._wake = wake
        self._ids = itertools.count(1)  # member-side request ids, unique over all members and probes

    @property
    def probe_s(self):
        return self.members.probe_s

    # ------------------------------------------------ membership

    def add(self, address, weight=1.0):
        return self.members.add(address, weight)

    def remove(self, address):
        """Take the member out: its unanswered requests fail as 'removed'. Returns (member, those gathers)."""
        member = self.members.remove(address)
        lost = self._unsettled(member)
        for gather in lost:
            gather.fail(address, "removed")
        return member, lost

    def new_id(self):
        """A member-side request id for a request outside the fan-out (a relayed model_info)."""
        return next(self._ids)

    # ------------------------------------------------ asking

    def ask(self, gather, now=None):
        """The members to send `gather`'s request to now, all under one new member-side id (`gather.rid`)
        and each already counted as asked; the unhealthy ones are recorded as skipped, and so are the busy
        ones (ensemble). ResourceExhaustedError (nothing asked) when busy members leave too few to ask."""
        now = time.monotonic() if now is None else now
        rid = gather.rid = next(self._ids)
        busy = self._busy(gather, now)
        targets = []
        if gather.mode == "replica":
            member = self.members.least_outstanding(exclude=busy)
            if member is not None:
                self._track(member, gather, rid)
                targets.append(member)
            for member in self.members.members.values():
                if not member.healthy:
                    gather.skipped(member.address, "unhealthy")
            return targets
        for member in self.members.members.values():
            if member.address in busy:
                gather.skipped(member.address, "busy")
            elif member.healthy:
                self._track(member, gather, rid)
                targets.append(member)
            else:
                gather.skipped(member.address, "unhealthy")
        return targets

    def _busy(self, gather, now):
        """The healthy members too busy to answer `gather` in time; sheds it when they leave too few."""
        budget = math.inf if gather.call.deadline is None else gather.call.deadline - now
        healthy = self.members.healthy()
        busy = [m for m in healthy if not self.admission.admits(m, budget)]
        if not busy:
            return set()
        for member in busy:
            member.counters["busy"] += 1
        if len(healthy) - len(busy) < (1 if gather.mode == "replica" else gather.min_members):
            wait_ms = self.admission.retry_after_ms(busy, budget, self.probe_s)
            raise ResourceExhaustedError(
                f"overloaded: {len(busy)} of {len(healthy)} healthy members are busy (each would answer later than "
                f"{self.admission.share:g} of the {max(0, budget) * 1000:.0f} ms left), {gather.min_members} needed; "
                f"shed, retry after {wait_ms} ms", {"retry_after_ms": wait_ms})
        return {m.address for m in busy}

    def unsent(self, member, gather, reason, now):
        """The request never left for `member` (its queue was full): a failure of the member, not retried."""
        self._record_failure(member, gather, "errors", reason, None, now)

    # ------------------------------------------------ replies

    def awaiting(self, member, rid):
        """What `member`'s reply `rid` answers: a Gather, a Probe, or None (a late reply, already forgotten)."""
        return member.inflight.get(rid)

    def answered(self, member, gather, probs):
        self._settle(member, gather.pending.get(member.address), answered=True)
        self.members.answered(member)
        gather.answer(member.address, probs, member.weight)

    def refused(self, member, gather, code, message, now):
        """`member` answered `gather` with error `code`. Returns the member a replica retry goes to, or None."""
        if code == DEADLINE_EXCEEDED:
            return self._fail_and_retry(member, gather, "timeouts", "timeout", code, now)
        return self._fail_and_retry(member, gather, "errors", f"error: {code_name(code)}: {message}", code, now)

    def bad_answer(self, member, gather, reason, now):
        """`member`'s answer was unusable (`reason`). Returns the member a replica retry goes to, or None."""
        return self._fail_and_retry(member, gather, "errors", reason, None, now)

    def disconnected(self, member, now):
        """`member`'s connection dropped: it is unhealthy first, so no retry picks it, then each request in
        flight to it fails now ('disconnected'). Returns [(gather, member its retry goes to, or None)]."""
        if self.members.disconnected(member, now):
            log.warning("member %s disconnected: unhealthy, probing every %.0f ms", member.address,
                        self.probe_s * 1000)
            self._wake(member.next_probe_at)
        return [(gather, self._fail_and_retry(member, gather, "errors", "disconnected", None, now))
                for gather in self._unsettled(member)]

    def unresolved(self, member, now, error=None):
        """`member`'s host name does not resolve (yet): unhealthy, looked up again at each probe."""
        if self.members.unresolved(member, now, error):
            log.warning("member %s: name does not resolve (%s); unhealthy, looking it up every %.0f ms",
                        member.address, error or "looking it up", self.probe_s * 1000)
        self._wake(member.next_probe_at)

    # ------------------------------------------------ finishing

    def forget(self, gather, now, timed_out):
        """`gather` is being answered: what it still awaits is forgotten, so late replies drop. At its
        deadline (`timed_out`) each silent member counts a timeout; answered early, nobody is blamed."""
        for address in list(gather.pending):
            member = self.members.get(address)
            if timed_out:
                self._record_failure(member, gather, "timeouts", "timeout", None, now)
            else:
                self._settle(member, gather.pending[address])
                gather.fail(address, "not awaited")

    def cancel(self, gather):
        """The client withdrew `gather`: nothing it awaits counts any more, and nobody is blamed."""
        for address, rid in gather.pending.items():
            member = self.members.get(address)
            if member is not None:
                self._settle(member, rid)
        gather.pending.clear()

    # ------------------------------------------------ probes

    def next_probe_at(self):
        return self.members.next_probe_at()

    def probes_due(self, now):
        return self.members.probes_due(now)

    def probe(self, member, now, timeout_s):
        """A probe goes to unhealthy `member` now and must be answered within `timeout_s`; returns its
        request id. The previous probe, still unanswered, is forgotten (its reply will drop)."""
        if member.probe_rid is not None:
            member.inflight.pop(member.probe_rid, None)
        rid = member.probe_rid = next(self._ids)
        member.inflight[rid] = Probe(now + timeout_s)
        self.members.probe_sent(member, now)
        return rid

    def probe_answered(self, member, rid, code, message, now):
        """`member` replied to probe `rid`: without error and in time, it is healthy again. True if taken back."""
        probe = member.inflight.pop(rid)
        member.probe_rid = None
        if code or now > probe.deadline:
            member.last_failure = f"probe: {message or 'answered too late'}"
            return False
        if member.healthy:
            return False
        self.members.recovered(member)
        log.info("member %s answered a probe: healthy again", member.address)
        return True

    # ------------------------------------------------ internals

    def _track(self, member, gather, rid):
        """`member` is asked for `gather` under `rid`: in flight until settled."""
        member.inflight[rid] = gather
        member.outstanding += 1
        member.pace.started()
        self.members.sent(member)
        gather.asked(member.address, rid)

    def _settle(self, member, rid, answered=False):
        """Request `rid` to `member` is no longer awaited (answered, failed or forgotten)."""
        if member.inflight.pop(rid, None) is not None:
            member.outstanding -= 1
            member.pace.settled(answered)

    def _unsettled(self, member):
        return [entry for entry in member.inflight.values()
                if isinstance(entry, Gather) and not entry.call.finished]

    def _record_failure(self, member, gather, kind, reason, code, now):
        """`member` failed `gather` (`kind`: timeouts|errors). The client's bad input is not held against it.
        Returns whether the failure counts against the member."""
        counts = code != INVALID_ARGUMENT
        busy = kind == "timeouts" or code == RESOURCE_EXHAUSTED  # evidence of load, not of a broken member
        self._settle(member, gather.pending.get(member.address))
        if self.members.failed(member, kind, reason, now, counts=counts, busy=busy):
            log.warning("member %s unhealthy after %d failures in a row (last: %s); probing every %.0f ms",
                        member.address, member.consecutive_failures, reason, self.probe_s * 1000)
            self._wake(member.next_probe_at)
        gather.fail(member.address, reason, code)
        return counts

    def _fail_and_retry(self, member, gather, kind, reason, code, now):
        if self._record_failure(member, gather, kind, reason, code, now):
            return self._retry(gather, now)
        return None

    def _retry(self, gather, now):
        """Replica mode, no answer yet and time left: a member not tried for `gather`, asked under a new id."""
        if gather.mode != "replica" or gather.answers or not now < gather.call.deadline:
            return None
        budget = gather.call.deadline - now
        busy = {m.address for m in self.members.healthy() if not self.admission.admits(m, budget)}
        other = self.members.least_outstanding(exclude=set(gather.failures) | set(gather.pending) | busy)
        if other is not None:
            gather.rid = next(self._ids)
            self._track(other, gather, gather.rid)
        return other
