"""`Aggregator`: one predict request fanned out to model servers, answered by the deadline.

Why one DEALER per member polled by the service's own loop: a request costs no thread and
nothing blocks; the client's call is parked with its deadline, every member's reply is
matched by the member-side request id, and the call is answered as soon as every asked
member has responded, or AT the deadline (the base deadline heap) with what arrived. The
ids of a finished request are forgotten at once, so a late reply is dropped by id and never
mixed into another request. Unhealthy members are probed on a timer riding the same heap.
Each member socket's monitor is polled too: a member whose connection drops (its process
died) is unhealthy at once and what was in flight to it fails then, not at the deadline.

Modes: `ensemble` asks every healthy member and combines; `replica` asks the one with the
fewest outstanding requests (a member that fails fast is replaced by another, never past
the deadline).
"""

import itertools
import logging
import time

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from zmqflow.common import curve, wire
from zmqflow.common.errors import (DEADLINE_EXCEEDED, INVALID_ARGUMENT, InvalidArgumentError, OpError, code_name)
from zmqflow.common.rpc_service import PARKED, Service
from zmqflow.services.aggregator.combine import check_combine
from zmqflow.services.aggregator.gather import Gather
from zmqflow.services.aggregator.members import MemberSet
from zmqflow.services.aggregator.stats import AggregatorStats

log = logging.getLogger(__name__)

MODES = ("ensemble", "replica")


class _Probe:
    """A health probe in flight to an unhealthy member."""

    __slots__ = ("member", "deadline")

    def __init__(self, member, deadline):
        self.member, self.deadline = member, deadline


class _Link:
    """The aggregator's socket to one member and the requests in flight on it (rid -> Gather or _Probe)."""

    __slots__ = ("address", "sock", "monitor", "inflight", "probe_rid")

    def __init__(self, context, address, limits, name):
        self.address = address
        self.sock = context.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.sndtimeo = 0  # a full queue fails the send instead of blocking the loop
        self.sock.sndhwm = self.sock.rcvhwm = 10_000
        self.sock.setsockopt(zmq.MAXMSGSIZE, limits.socket_max_frame_bytes)
        self.sock.routing_id = f"{name}-{id(self):x}-{time.monotonic_ns() % 10**9}".encode()
        keys = curve.curve_dir_from_env()
        curve.secure_client(self.sock, curve.ClientKeys(keys) if keys else None)
        # the connection's events: a member whose process dies is known at once, not after timeouts
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.sock.connect(address)
        self.inflight = {}
        self.probe_rid = None

    def lost_connection(self):
        """True if the monitor reported the connection to the member gone (reads every pending event)."""
        lost = False
        while wire.readable(self.monitor):
            event = recv_monitor_message(self.monitor)
            lost = lost or event["event"] == zmq.EVENT_DISCONNECTED
        return lost

    def close(self):
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)


class Aggregator(Service):
    name = "aggregator"

    def __init__(self, bind, members=(), mode="ensemble", deadline_ms=1000, min_members=1, combine="mean",
                 unhealthy_after=3, probe_ms=500, **service_options):
        super().__init__(bind, **service_options)
        self.mode = _check_mode(mode)
        self.deadline_ms = _check_int("deadline_ms", deadline_ms, 1)
        self.min_members = _check_int("min_members", min_members, 1)
        self.combine = check_combine(combine)
        self.members = MemberSet(unhealthy_after, probe_ms / 1000.0)
        self.links = {}
        self.agg_stats = AggregatorStats()
        self._features = None  # input width of the last request a member answered: probes send one such row
        self._timer_at = None
        self._ids = itertools.count(1)  # member-side request ids: one per client request, the same to every member
        for address, weight in members:
            self._add(address, weight)
        self.handlers.update(predict=self._predict, add_member=self._add_member, remove_member=self._remove_member,
                             members=self._members, stats=self._stats)

    # ------------------------------------------------ membership

    def _add(self, address, weight=1.0):
        address = normalize_address(address)
        member = self.members.add(address, weight)
        try:
            link = _Link(self.context, address, self.limits, "aggregator")
        except zmq.ZMQError as exc:
            self.members.remove(address)
            raise InvalidArgumentError(f"cannot connect to member {address!r}: {exc}") from None
        self.links[address] = link
        self.add_socket(link.sock, lambda: self._drain_member(link))
        self.add_socket(link.monitor, lambda: self._watch_member(link))
        log.info("member %s added (weight %g)", address, member.weight)
        return member

    def _add_member(self, call):
        return {"member": self._add(call.args.get("address"), call.args.get("weight", 1.0)).describe()}

    def _remove_member(self, call):
        address = call.args.get("address")
        address = normalize_address(address) if isinstance(address, str) and address else address
        member = self.members.remove(address)
        link = self.links.pop(address)
        self.remove_socket(link.sock)
        self.remove_socket(link.monitor)
        link.close()
        now = time.monotonic()
        for entry in link.inflight.values():
            if isinstance(entry, Gather) and not entry.call.finished:
                entry.fail(address, "removed")
                self._advance(entry, now)
        log.info("member %s removed", address)
        return {"member": member.describe()}

    def _members(self, call):
        return {"members": [m.describe() for m in self.members.members.values()]}

    # ------------------------------------------------ predict

    def _predict(self, call):
        x = _check_input(call.tensors)
        call.tensors = [x]
        args = call.args
        mode = _check_mode(args.get("mode") or self.mode)
        combine = check_combine(args.get("combine") or self.combine)
        deadline_ms = args.get("deadline_ms")
        deadline_ms = self.deadline_ms if deadline_ms is None else _check_int("deadline_ms", deadline_ms, 1)
        min_members = args.get("min_members")
        min_members = self.min_members if min_members is None else _check_int("min_members", min_members, 1)
        now = time.monotonic()
        deadline = call.received + deadline_ms / 1000.0
        call.deadline = deadline if call.deadline is None else min(deadline, call.deadline)
        self.agg_stats.counters["requests"] += 1
        gather = call.state = Gather(call, mode, combine, 1 if mode == "replica" else min_members, call.received)
        gather.shape = x.shape
        gather.payload = self._request(x, gather.call.deadline, now)
        if mode == "replica":
            member = self.members.least_outstanding()
            if member is not None:
                self._ask(member, gather, now)
            for m in self.members.unhealthy():
                gather.skipped(m.address, "unhealthy")
        else:
            for member in list(self.members.members.values()):
                if member.healthy:
                    self._ask(member, gather, now)
                else:
                    gather.skipped(member.address, "unhealthy")
        if gather.finished():
            self._finish(gather, now)
            return PARKED  # already answered by _finish
        return self.park(call)

    def _ask(self, member, gather, now, retry=False):
        link = self.links[member.address]
        rid, frames = gather.payload
        if retry:  # the time left has shrunk since the first ask
            rid, frames = gather.payload = self._request(gather.call.tensors[0], gather.call.deadline, now)
        try:
            wire.send_message(link.sock, frames)
        except zmq.ZMQError as exc:
            self.members.sent(member)
            self._member_failed(member, gather, "errors", f"error: send failed: {exc}", None, now, advance=False)
            return
        link.inflight[rid] = gather
        gather.asked(member.address, rid)
        self.members.sent(member)

    def _request(self, x, deadline, now):
        """(rid, frames) of one predict to members, encoded once however many are asked."""
        rid = next(self._ids)
        return rid, wire.request_frames("predict", rid, {}, [x], max(1, int((deadline - now) * 1000)))

    # ------------------------------------------------ member replies

    def _drain_member(self, link):
        sock = link.sock
        while not sock.closed and wire.readable(sock):
            _, header, frames, error = wire.recv_message(sock, False, self.limits)
            now = time.monotonic()
            if header is None:
                log.warning("malformed reply from member %s dropped: %s", link.address, error)
                continue
            entry = link.inflight.pop(header.get("id"), None)
            if entry is None:
                self.agg_stats.counters["late_dropped"] += 1
                continue
            member = self.members.get(link.address)
            if isinstance(entry, _Probe):
                self._probe_answered(link, entry, header, now)
                continue
            code = header.get("code", 0)
            if code:
                kind = "timeouts" if code == DEADLINE_EXCEEDED else "errors"
                reason = "timeout" if kind == "timeouts" else f"error: {code_name(code)}: {header.get('error')}"
                self._member_failed(member, entry, kind, reason, code, now)
                continue
            probs = self._decode_answer(entry, header, frames)
            if isinstance(probs, str):
                self._member_failed(member, entry, "errors", probs, None, now)
                continue
            self.members.answered(member)
            entry.answer(link.address, probs, member.weight)
            if entry.finished():
                self._finish(entry, now)

    def _watch_member(self, link):
        """The member's connection dropped (its process died or closed): fail what is in flight to it
        now (replica mode retries elsewhere), mark it unhealthy and probe it until it answers again."""
        if link.sock.closed or not link.lost_connection():
            return
        member, now = self.members.get(link.address), time.monotonic()
        if member is None:
            return
        if self.members.disconnected(member, now):  # first, so no retry below picks it again
            log.warning("member %s disconnected: unhealthy, probing every %.0f ms", link.address,
                        self.members.probe_s * 1000)
            self._schedule_wake(member.next_probe_at)
        for rid, entry in list(link.inflight.items()):
            if isinstance(entry, Gather) and not entry.call.finished:
                del link.inflight[rid]
                self._member_failed(member, entry, "errors", "disconnected", None, now)

    def _decode_answer(self, gather, header, frames):
        """The member's probabilities, or a string saying what is wrong with its answer."""
        try:
            tensors = wire.decode_tensors(header.get("tensors", []), frames, self.limits)
        except OpError as exc:
            return f"error: bad answer: {exc}"
        if len(tensors) != 1 or tensors[0].ndim != 2 or tensors[0].dtype.kind != "f" or \
                tensors[0].shape[0] != gather.shape[0]:
            return f"error: bad answer: expected one float tensor [{gather.shape[0]}, classes], " \
                   f"got {[list(t.shape) for t in tensors]}"
        return tensors[0]

    def _member_failed(self, member, gather, kind, reason, code, now, advance=True):
        counts = code != INVALID_ARGUMENT  # the client's bad input is not the member's fault
        if self.members.failed(member, kind, reason, now, counts=counts):
            log.warning("member %s unhealthy after %d failures in a row (last: %s); probing every %.0f ms",
                        member.address, member.consecutive_failures, reason, self.members.probe_s * 1000)
            self._schedule_wake(member.next_probe_at)
        gather.fail(member.address, reason, code)
        if not advance:
            return
        if gather.mode == "replica" and not gather.answers and counts and now < gather.call.deadline:
            tried = set(gather.failures) | set(gather.pending)
            other = self.members.least_outstanding(exclude=tried)
            if other is not None:
                self._ask(other, gather, now, retry=True)
        self._advance(gather, now)

    def _advance(self, gather, now):
        if gather.finished() and not gather.call.finished:
            self._finish(gather, now)

    # ------------------------------------------------ answering

    def _finish(self, gather, now, timed_out=False):
        """Answer the client with what arrived; forget every member request still out (late replies drop)."""
        if gather.call.finished:
            return
        for address, rid in list(gather.pending.items()):
            link, member = self.links.get(address), self.members.get(address)
            if link is not None:
                link.inflight.pop(rid, None)
            if timed_out:
                self._member_failed(member, gather, "timeouts", "timeout", None, now, advance=False)
            else:
                member.outstanding -= 1
                gather.fail(address, "not awaited")
        call = gather.call
        try:
            probs, info = gather.outcome()
        except OpError as exc:
            self.agg_stats.record(time.monotonic() - call.received, ok=False)
            self.fail(call, exc)
            return
        self._features = gather.shape[1]
        info["latency_ms"] = round((time.monotonic() - call.received) * 1000.0, 3)
        self.agg_stats.record(time.monotonic() - call.received, ok=True, partial=bool(info["missing"]))
        self.reply(call, info, [probs])

    def on_deadline(self, call):
        gather = call.state
        if isinstance(gather, Gather):
            self._finish(gather, time.monotonic(), timed_out=True)
        else:
            super().on_deadline(call)

    def on_cancel(self, call, error):
        gather = call.state
        if isinstance(gather, Gather):
            for address, rid in list(gather.pending.items()):
                link, member = self.links.get(address), self.members.get(address)
                if link is not None and link.inflight.pop(rid, None) is not None:
                    member.outstanding -= 1
            gather.pending.clear()
        self.fail(call, error)

    # ------------------------------------------------ probes

    def _expire(self, now):
        super()._expire(now)
        if self.members.next_probe_at() is not None:
            for member in self.members.probes_due(now):
                self._probe(member, now)
            self._schedule_wake(self.members.next_probe_at())

    def _probe(self, member, now):
        link = self.links[member.address]
        if link.probe_rid is not None:
            link.inflight.pop(link.probe_rid, None)  # the previous probe went unanswered
        timeout_ms = max(1, int(min(self.deadline_ms, self.members.probe_s * 1000)))
        rid = next(self._ids)
        if self._features:
            tensors = [np.zeros((1, self._features), np.float32)]
            frames = wire.request_frames("predict", rid, {}, tensors, timeout_ms)
        else:
            frames = wire.request_frames("ping", rid, {"ids": []}, (), timeout_ms)
        self.members.probe_sent(member, now)
        self.agg_stats.counters["probes"] += 1
        try:
            wire.send_message(link.sock, frames)
        except zmq.ZMQError:
            return
        link.inflight[rid] = _Probe(member, now + timeout_ms / 1000.0)
        link.probe_rid = rid

    def _probe_answered(self, link, probe, header, now):
        link.probe_rid = None
        if header.get("code", 0) or now > probe.deadline:
            probe.member.last_failure = f"probe: {header.get('error') or 'answered too late'}"
            return
        if self.members.get(link.address) is probe.member:
            self.members.recovered(probe.member)
            log.info("member %s answered a probe: healthy again", link.address)

    def _schedule_wake(self, when):
        """Make the loop wake at `when` for the next probe (one wake-up pending at a time)."""
        if when is None:
            return
        now = time.monotonic()
        if self._timer_at is not None and now < self._timer_at <= when:
            return
        self._timer_at = when
        self.wake_at(when)

    # ------------------------------------------------ introspection

    def _stats(self, call):
        members = self.members.members.values()
        return {**self.agg_stats.counters, "mode": self.mode, "combine": self.combine,
                "deadline_ms": self.deadline_ms, "min_members": self.min_members,
                "answers": {m.address: m.counters["answers"] for m in members},
                "timeouts": {m.address: m.counters["timeouts"] for m in members},
                "errors": {m.address: m.counters["errors"] for m in members},
                "members": [m.describe() for m in members],
                "latency_ms": self.agg_stats.latency_ms()}

    def describe(self):
        return {"mode": self.mode, "members": len(self.members), "healthy": len(self.members.healthy())}

    def metric_families(self):
        """Counters per member and per aggregator for Prometheus, read at scrape time (common/metrics.py)."""
        from zmqflow.common.metrics import counter_family, gauge_family
        members = list(self.members.members.values())
        for key in ("requests", "answers", "timeouts", "errors", "probes", "recoveries"):
            yield counter_family(f"zmqflow_aggregator_member_{key}", f"Member {key}, per member.",
                                 {(m.address,): m.counters[key] for m in members}, ["member"])
        yield gauge_family("zmqflow_aggregator_member_healthy", "1 while the member is healthy.",
                           {(m.address,): int(m.healthy) for m in members}, ["member"])
        yield gauge_family("zmqflow_aggregator_member_outstanding", "Requests the member has not answered yet.",
                           {(m.address,): m.outstanding for m in members}, ["member"])
        for key, count in self.agg_stats.counters.items():
            yield counter_family(f"zmqflow_aggregator_{key}", f"Client requests: {key}.", count)

    def close(self):
        for link in self.links.values():
            self.remove_socket(link.sock)
            self.remove_socket(link.monitor)
            link.close()
        self.links.clear()
        super().close()


# ------------------------------------------------ argument checks


def normalize_address(address):
    """`host:port` means tcp://host:port; other endpoints pass as they are."""
    if not isinstance(address, str) or not address:
        raise InvalidArgumentError(f"member address must be a non-empty string, got {address!r:.80}")
    return address if "://" in address else f"tcp://{address}"


def _check_mode(mode):
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be one of {', '.join(MODES)}, got {mode!r:.80}")
    return mode


def _check_int(name, value, low):
    if type(value) is not int or value < low:
        raise InvalidArgumentError(f"{name} must be an int >= {low}, got {value!r:.80}")
    return value


def _check_input(tensors):
    if len(tensors) != 1:
        raise InvalidArgumentError(f"predict takes one tensor x [n, features], got {len(tensors)}")
    x = tensors[0]
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0 or x.dtype.kind not in "fiu":
        raise InvalidArgumentError(f"predict input must be numbers of shape [n >= 1, features >= 1], "
                                   f"got {x.dtype} {list(x.shape)}")
    return np.ascontiguousarray(x, dtype=np.float32)
