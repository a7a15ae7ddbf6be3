"""`Aggregator`: one predict request fanned out to model servers, answered by the deadline.

Why one LoopClient per member (common/rpc/service.py: its socket polled by the service's own loop): a
request costs no thread and nothing blocks; the client's call is parked with its deadline, every
member's reply is matched by the member-side request id, and the call is answered as soon as every
asked member has responded, or AT the deadline (the base deadline heap) with what arrived. A request
the members are too busy to answer in time is shed at once (RESOURCE_EXHAUSTED, counted `shed`). A
member whose connection drops (its process died) is known at once, not at the deadline. Probes of
unhealthy members ride the same heap. Links connect to the address a member's name resolves to,
never to the name (common/rpc/resolver.py).

This file only moves messages: whom to ask, what is in flight, retries, health, ejection
and probing are the fan-out policy's (fanout.py), which gets every reply, failure, dropped
connection and deadline from here.
"""

import logging
import math
import time

import numpy as np
import zmq

from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import InvalidArgumentError, OpError, ResourceExhaustedError, UnavailableError, check_int, \
    error_from_code
from zmqflow.common.rpc.service import PARKED, LoopClient, Service
from zmqflow.common.rpc.probe import endpoint_of
from zmqflow.common.rpc.resolver import default_resolver
from zmqflow.services.aggregator.admission import Admission, QueueDelay
from zmqflow.models.combine import COMBINERS, CustomCombine, check_combine
from zmqflow.services.aggregator.fanout import FanOut, Probe
from zmqflow.services.aggregator.gather import Gather
from zmqflow.services.aggregator.stats import AggregatorStats
from zmqflow.common.wire.protocol import AggregatorOps, Ops, ServeOps, aggregator_mode

log = logging.getLogger(__name__)


class Aggregator(Service):
    name = "aggregator"
    protocol = AggregatorOps

    def __init__(self, bind, members=(), mode="ensemble", deadline_ms=1000, min_members=1, combine="mean",
                 unhealthy_after=3, probe_ms=500, min_healthy=None, admit_share=0.5, resolver=default_resolver,
                 **service_options):
        super().__init__(bind, **service_options)
        self.resolver = resolver
        self.mode = aggregator_mode(mode, "mode")
        self.deadline_ms = check_int("deadline_ms", deadline_ms, 1)
        self.min_members = check_int("min_members", min_members, 1)
        self.custom = CustomCombine(combine) if combine not in COMBINERS else None
        self.combine = check_combine(combine, self.custom)
        # timeouts never eject the last members a request needs: under overload they are busy, not broken
        self.min_healthy = max(1, self.min_members) if min_healthy is None else check_int("min_healthy", min_healthy, 0)
        self.fanout = FanOut(unhealthy_after, probe_ms / 1000.0, wake=self._schedule_wake, min_healthy=self.min_healthy,
                             admission=Admission(admit_share))
        self.members = self.fanout.members  # read-only here: listing, stats, metrics
        self.links = {}   # member address -> LoopClient, each in this service's context: one I/O thread for all
        self.agg_stats = AggregatorStats()
        self.queue_delay = QueueDelay()
        self._probe_request = None  # (args, one row of zeros per input) like the last request members answered
        self._probe_key = None      # the input names, shapes and dtypes it was made for
        self._timer_at = None
        self._relays = {}           # member-side id -> (client call, member address) of a relayed model_info
        for address, weight in members:
            self._add(address, weight)
        self.serve({AggregatorOps.Predict: self._predict, AggregatorOps.AddMember: self._add_member,
                    AggregatorOps.RemoveMember: self._remove_member, AggregatorOps.Members: self._members,
                    AggregatorOps.Stats: self._stats, AggregatorOps.ModelInfo: self._model_info})

    # ------------------------------------------------ membership

    def _add(self, address, weight=1.0):
        address = endpoint_of(address)
        member = self.fanout.add(address, weight)
        link = LoopClient(self, address, "aggregator", lambda call: self._member_replied(address, call),
                          lambda: self._member_lost(address), self.resolver, context=self.context)
        try:
            self._connect(member, link, time.monotonic())
        except zmq.ZMQError as exc:
            link.close()
            self.fanout.remove(address)
            raise InvalidArgumentError(f"cannot connect to member {address!r}: {exc}") from None
        self.links[address] = link
        log.info("member %s added (weight %g)", address, member.weight)
        return member

    def _connect(self, member, link, now):
        """Connect `link` to the member's address as the resolver knows it now, without waiting for a
        lookup. A name that does not resolve (yet) leaves the member unhealthy: each probe looks it up
        again. True if the link is connected (maybe still to the address it had before)."""
        endpoint = link.connect()
        if endpoint is None:
            self.fanout.unresolved(member, now, self.resolver.error(link.address))
        elif endpoint != member.connected_to:
            member.connected_to = endpoint
            log.info("member %s connected to %s", member.address, endpoint)
        return link.endpoint is not None

    def _add_member(self, call):
        return {"member": self._add(call.args.address, call.args.weight).describe()}

    def _remove_member(self, call):
        address = endpoint_of(call.args.address)
        member, lost = self.fanout.remove(address)
        self.links.pop(address).close()
        now = time.monotonic()
        for gather in lost:
            self._advance(gather, now)
        log.info("member %s removed", address)
        return {"member": member.describe()}

    def _members(self, call):
        return {"members": [m.describe() for m in self.members.members.values()]}

    def _model_info(self, call):
        """Relay model_info to the healthy member with the fewest requests out; its answer (or refusal) is the
        client's. The members of one aggregator serve one model's schema (an ensemble of models of one task)."""
        member = self.members.least_outstanding(exclude=set())
        if member is None:
            raise UnavailableError(f"no healthy member to ask for its model ({len(self.members)} members)")
        rid, now = self.fanout.new_id(), time.monotonic()
        timeout = 5.0 if call.deadline is None else max(0.001, call.deadline - now)
        try:
            self.links[member.address].submit(ServeOps.ModelInfo(), None, (), timeout, rid)
        except zmq.ZMQError as exc:
            raise UnavailableError(f"cannot ask member {member.address} for its model: {exc}") from None
        self._relays[rid] = (call, member.address)
        return self.park(call)

    def _relayed(self, rid, call):
        """A member's answer to a relayed model_info: passed on as it came."""
        client_call, _ = self._relays.pop(rid)
        if call.error is not None:
            self.fail(client_call, error_from_code(call.error.code, call.error.message))
        else:
            header, _ = call.value
            self.reply(client_call, header.get("result") or {})

    # ------------------------------------------------ predict

    def _predict(self, call):
        rows = _check_request(call)
        args = call.args
        mode = args.mode or self.mode
        combine = check_combine(args.combine or self.combine, self.custom)
        deadline_ms = args.deadline_ms or self.deadline_ms
        min_members = args.min_members or self.min_members
        now = time.monotonic()
        self.agg_stats.counters["requests"] += 1
        waited = self._waited(call) if self.fanout.admission.enabled else 0.0
        deadline = call.received + deadline_ms / 1000.0 - waited
        call.deadline = deadline if call.deadline is None else min(deadline, call.deadline)
        if waited and call.deadline <= now:
            self.agg_stats.counters["shed"] += 1
            raise ResourceExhaustedError(f"overloaded: the request waited {waited * 1000:.0f} ms before the aggregator "
                                         f"read it, past its {deadline_ms} ms deadline; shed, retry after "
                                         f"{math.ceil(waited * 1000)} ms", {"retry_after_ms": math.ceil(waited * 1000)})
        gather = Gather(call, mode, combine, 1 if mode == "replica" else min_members, call.received, self.custom)
        gather.shape = (rows,)
        try:
            targets = self.fanout.ask(gather, now)
        except ResourceExhaustedError:
            self.agg_stats.counters["shed"] += 1  # answered at once by the base loop, with its retry hint
            raise
        encoded = None   # one encoding of the member request, sent to every member
        for member in targets:
            encoded = self._send_to(member, gather, now, encoded)
        if gather.finished():
            self._finish(gather, now)
            return PARKED  # already answered by _finish
        call.state = gather  # for on_deadline and on_cancel; answering lets go of it (rpc_service.Call)
        return self.park(call)

    def _waited(self, call):
        """Seconds the request waited before it was read, when its client said when it sent it (`sent_at`)."""
        sent_at = call.args.sent_at
        if sent_at is None:
            return 0.0
        return self.queue_delay.waited(call.identity, float(sent_at), time.time() - (time.monotonic() - call.received))

    def _send_to(self, member, gather, now, encoded=None):
        """`gather`'s predict to `member`, under its current member-side id, with the time left as deadline;
        `encoded`: the same request as sent to another member at `now` (None: encode it). Returns the encoding
        (a fan-out encodes its tensors once: 22 us a member with three members)."""
        call, link = gather.call, self.links[member.address]
        timeout = max(0.001, call.deadline - now)
        try:
            encoded = encoded or link.calls.encode(_member_request(call.args), None, call.tensors, timeout, gather.rid)
            link.submit(ServeOps.Predict.OP, None, call.tensors, timeout, gather.rid, encoded)
        except zmq.ZMQError as exc:
            self.fanout.unsent(member, gather, f"error: send failed: {exc}", now)
        return encoded

    # ------------------------------------------------ member replies

    def _member_replied(self, address, call):
        if call.id in self._relays:
            self._relayed(call.id, call)
            return
        member, now = self.members.get(address), time.monotonic()
        entry = self.fanout.awaiting(member, call.id)
        code, message = (call.error.code, call.error.message) if call.error is not None else (0, None)
        if entry is None:
            self.agg_stats.counters["late_dropped"] += 1
        elif isinstance(entry, Probe):
            self.fanout.probe_answered(member, call.id, code, message, now)
        elif code:
            self._go_on(entry, self.fanout.refused(member, entry, code, message, now), now)
        else:
            self._take_answer(member, entry, *call.value, now)

    def _take_answer(self, member, gather, header, frames, now):
        probs = self._decode_answer(gather, header, frames)
        if isinstance(probs, str):
            self._go_on(gather, self.fanout.bad_answer(member, gather, probs, now), now)
            return
        labels = (header.get("result") or {}).get("labels")
        if isinstance(labels, dict) and gather.labels is None:
            gather.labels = labels
        self.fanout.answered(member, gather, probs)
        self._advance(gather, now)

    def _member_lost(self, address):
        """The member's connection dropped (its process died or closed): the policy fails what is in
        flight to it now; replica retries go out here. The probes reconnect to where its name points then."""
        for rid, (client_call, relayed_to) in list(self._relays.items()):
            if relayed_to == address:
                del self._relays[rid]
                self.fail(client_call, UnavailableError(f"member {address} went away before it said its model"))
        member = self.members.get(address)
        if member is None:
            return
        now = time.monotonic()
        for gather, retry in self.fanout.disconnected(member, now):
            self._go_on(gather, retry, now)

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

    def _go_on(self, gather, retry, now):
        """After a member failed `gather`: send the retry the policy chose, if any; answer if nothing more can come."""
        if retry is not None:
            self._send_to(retry, gather, now)
        self._advance(gather, now)

    def _advance(self, gather, now):
        if gather.finished() and not gather.call.finished:
            self._finish(gather, now)

    # ------------------------------------------------ answering

    def _finish(self, gather, now, timed_out=False):
        """Answer the client with what arrived; every member request still out is forgotten (late replies drop)."""
        call = gather.call
        if call.finished:
            return
        self.fanout.forget(gather, now, timed_out)
        try:
            probs, info = gather.outcome()
        except OpError as exc:
            self.agg_stats.record(time.monotonic() - call.received, ok=False)
            self.fail(call, exc)
            return
        if call.tensors:
            self._remember_probe(call)
        info["latency_ms"] = round((time.monotonic() - call.received) * 1000.0, 3)
        self.agg_stats.record(time.monotonic() - call.received, ok=True, partial=bool(info["missing"]))
        self.reply(call, info, [probs])

    def _remember_probe(self, call):
        """A probe is a request like `call` (the last answered) on one row of zeros: made again only when the
        input names, shapes or dtypes change, not for every answer (two arrays and a request a predict)."""
        key = (call.args.inputs and tuple(call.args.inputs), tuple((t.shape[1:], t.dtype) for t in call.tensors))
        if self._probe_request is None or self._probe_key != key:
            self._probe_key = key
            self._probe_request = (_member_request(call.args), [np.zeros((1,) + t.shape[1:], t.dtype)
                                                                for t in call.tensors])

    def on_deadline(self, call):
        gather = call.state
        if isinstance(gather, Gather):
            self._finish(gather, time.monotonic(), timed_out=True)
        else:
            super().on_deadline(call)

    def on_cancel(self, call, error):
        gather = call.state
        if isinstance(gather, Gather):
            self.fanout.cancel(gather)
        self.fail(call, error)  # lets go of the gather (rpc_service.Call)

    # ------------------------------------------------ probes

    def _expire(self, now):
        super()._expire(now)
        if self.fanout.next_probe_at() is not None:
            for member in self.fanout.probes_due(now):
                self._probe(member, now)
            self._schedule_wake(self.fanout.next_probe_at())

    def _probe(self, member, now):
        link = self.links[member.address]
        try:
            if not self._connect(member, link, now):
                return  # nothing to probe yet: its name is looked up again at the next probe
        except zmq.ZMQError as exc:
            self.fanout.unresolved(member, now, f"cannot connect: {exc}")
            return
        timeout_ms = max(1, int(min(self.deadline_ms, self.fanout.probe_s * 1000)))
        rid = self.fanout.probe(member, now, timeout_ms / 1000.0)
        request, tensors = self._probe_request or (Ops.Ping(), ())
        self.agg_stats.counters["probes"] += 1
        try:
            link.submit(request, None, tensors, timeout_ms / 1000.0, rid)
        except zmq.ZMQError:
            pass  # no reply will come: the next probe replaces this one

    def _schedule_wake(self, when):
        """Make the loop wake at `when` for the next probe (one wake-up pending at a time)."""
        if when is None:
            return
        now = time.monotonic()
        if self._timer_at is not None and now < self._timer_at <= when:
            return
        self._timer_at = when
        self.wake_at(when)

    def housekeeping(self, now):
        """Once a second: member requests past their deadline and grace are given up (their replies drop)."""
        for link in self.links.values():
            link.expire(now)
        for rid in [rid for rid, (client_call, _) in self._relays.items() if client_call.finished]:
            del self._relays[rid]   # its client gave up (deadline, cancel): a late answer has nowhere to go

    # ------------------------------------------------ introspection

    def _stats(self, call):
        members = self.members.members.values()
        return {**self.agg_stats.counters, "mode": self.mode, "combine": self.combine,
                "deadline_ms": self.deadline_ms, "min_members": self.min_members, "min_healthy": self.min_healthy,
                "admit_share": self.fanout.admission.share,
                **{key: {m.address: m.counters[key] for m in members} for key in ("answers", "timeouts", "errors")},
                "members": [m.describe() for m in members],
                "latency_ms": self.agg_stats.latency_ms()}

    def describe(self):
        return {"mode": self.mode, "members": len(self.members), "healthy": len(self.members.healthy())}

    def metric_families(self):
        """Counters per member and per aggregator for Prometheus, read at scrape time (common/processes/metrics.py)."""
        from zmqflow.common.processes.metrics import counter_family, gauge_family
        members = list(self.members.members.values())
        for key in ("requests", "answers", "timeouts", "errors", "probes", "recoveries", "busy"):
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
            link.close()
        self.links.clear()
        super().close()


# ------------------------------------------------ argument checks


def _check_request(call):
    """The request's rows: its tensors (one per model input, n >= 1 rows each; floats become float32)
    or its records ({column: [values]}, checked by the members, which know the columns)."""
    records = call.args.records
    if records is not None:
        if call.tensors or not records or not all(isinstance(v, list) for v in records.values()):
            raise InvalidArgumentError("records is a mapping {column: [values, ...]} sent without tensors")
        lengths = {len(v) for v in records.values()}
        if len(lengths) != 1 or 0 in lengths:
            raise InvalidArgumentError(f"records need one non-zero number of values per column, got {sorted(lengths)}")
        return lengths.pop()
    if not call.tensors:
        raise InvalidArgumentError("predict takes the model's input tensors x [n, ...] (or records)")
    for i, x in enumerate(call.tensors):
        if x.ndim < 2 or x.shape[0] == 0 or 0 in x.shape[1:] or x.dtype.kind not in "fiu":
            raise InvalidArgumentError(f"predict input {i} must be numbers of shape [n >= 1, features >= 1, ...], "
                                       f"got {x.dtype} {list(x.shape)}")
    rows = {len(x) for x in call.tensors}
    if len(rows) != 1:
        raise InvalidArgumentError(f"every input needs the same number of rows, got {sorted(rows)}")
    call.tensors = [np.ascontiguousarray(x, dtype=np.float32 if x.dtype.kind == "f" else None) for x in call.tensors]
    return rows.pop()


def _member_request(args):
    """What of a client's predict the members get: the input names or the records."""
    return ServeOps.Predict(args.inputs, args.records)
