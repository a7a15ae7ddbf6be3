"""The fan-out policy without sockets: whom a request goes to, retries, ejection, probes, disconnects."""

import numpy as np
import pytest

from zmqflow.common.errors import DEADLINE_EXCEEDED, INVALID_ARGUMENT, UNAVAILABLE
from zmqflow.common.rpc.service import Call
from zmqflow.services.aggregator.fanout import FanOut, Probe
from zmqflow.services.aggregator.gather import Gather

pytestmark = pytest.mark.unit

PROBS = np.ones((1, 3), np.float32)


def policy(n=3, unhealthy_after=3, probe_s=0.5):
    """A FanOut over members a, b, c...; the wake-ups it asks for land in `.wakes`."""
    wakes = []
    fanout = FanOut(unhealthy_after, probe_s, wake=wakes.append)
    fanout.wakes = wakes
    members = [fanout.add(f"tcp://{name}:1") for name in "abcdefgh"[:n]]
    return fanout, members


def gather(mode="ensemble", deadline=10.0, min_members=1):
    call = Call(b"client", 1, "predict", {}, [], deadline, 0.0)
    return Gather(call, mode, "mean", min_members, 0.0)


def in_flight(members):
    return [m.outstanding for m in members]


# ------------------------------------------------ whom to ask


def test_ensemble_asks_every_healthy_member_under_one_id_and_skips_the_unhealthy():
    fanout, (a, b, c) = policy()
    b.healthy = False
    g = gather()
    assert fanout.ask(g) == [a, c]
    assert g.pending == {a.address: g.rid, c.address: g.rid} and g.failures == {b.address: "unhealthy"}
    assert fanout.awaiting(a, g.rid) is g and fanout.awaiting(b, g.rid) is None
    assert in_flight([a, b, c]) == [1, 0, 1] and a.counters["requests"] == 1 and b.counters["requests"] == 0


def test_each_request_gets_a_new_member_side_id():
    fanout, _ = policy()
    first, second = gather(), gather()
    fanout.ask(first)
    fanout.ask(second)
    assert first.rid != second.rid


def test_replica_asks_the_member_with_the_fewest_outstanding():
    fanout, (a, b, c) = policy()
    for _ in range(2):
        fanout.ask(gather("replica"))  # two members busy now, one idle
    idle = [m for m in (a, b, c) if m.outstanding == 0]
    assert len(idle) == 1
    g = gather("replica")
    assert fanout.ask(g) == idle and list(g.pending) == [idle[0].address]


def test_replica_spreads_equal_members_in_turn():
    fanout, members = policy()
    asked = [fanout.ask(gather("replica"))[0] for _ in range(6)]
    assert in_flight(members) == [2, 2, 2] and set(asked) == set(members)


def test_replica_skips_the_unhealthy_and_with_none_healthy_asks_nobody():
    fanout, (a, b, c) = policy()
    a.healthy = b.healthy = c.healthy = False
    g = gather("replica")
    assert fanout.ask(g) == [] and g.finished()
    assert g.failures == {a.address: "unhealthy", b.address: "unhealthy", c.address: "unhealthy"}


# ------------------------------------------------ replies and retries


def test_an_answer_settles_the_request_and_resets_the_failure_count():
    fanout, (a,) = policy(1)
    a.consecutive_failures = 2
    g = gather()
    fanout.ask(g)
    fanout.answered(a, g, PROBS)
    assert g.answers[a.address] is PROBS and g.weights[a.address] == 1.0 and g.finished()
    assert a.outstanding == 0 and a.consecutive_failures == 0 and a.counters["answers"] == 1
    assert fanout.awaiting(a, g.rid) is None  # a second reply to it is late


def test_a_replica_retry_goes_to_a_member_not_tried_yet_under_a_new_id():
    fanout, members = policy()
    g = gather("replica")
    (first,) = fanout.ask(g)
    first_rid = g.rid
    second = fanout.refused(first, g, UNAVAILABLE, "down", now=1.0)
    assert second is not None and second is not first and g.rid != first_rid
    assert g.pending == {second.address: g.rid} and g.failures == {first.address: "error: UNAVAILABLE: down"}
    third = fanout.bad_answer(second, g, "error: bad answer", now=1.0)
    assert third not in (None, first, second)
    assert fanout.refused(third, g, UNAVAILABLE, "down", now=1.0) is None  # everyone tried
    assert g.finished() and in_flight(members) == [0, 0, 0]


def test_a_replica_retry_excludes_the_member_that_failed_even_when_it_is_the_least_busy():
    fanout, members = policy()
    early = gather()
    fanout.ask(early)
    fanout.ask(gather())  # every member has two in flight
    g = gather("replica")
    (first,) = fanout.ask(g)
    fanout.answered(first, early, PROBS)
    retry = fanout.refused(first, g, UNAVAILABLE, "down", now=1.0)
    assert first.outstanding == 1 and retry is not None and retry is not first and retry.outstanding == 3


def test_a_replica_retry_never_goes_past_the_deadline():
    fanout, members = policy()
    g = gather("replica", deadline=5.0)
    (first,) = fanout.ask(g)
    assert fanout.refused(first, g, UNAVAILABLE, "down", now=5.0) is None
    assert g.pending == {} and in_flight(members) == [0, 0, 0]


def test_the_clients_bad_input_is_neither_held_against_a_member_nor_retried():
    fanout, (a, b) = policy(2, unhealthy_after=1)
    g = gather("replica")
    (first,) = fanout.ask(g)
    assert fanout.refused(first, g, INVALID_ARGUMENT, "bad shape", now=1.0) is None
    assert first.healthy and first.consecutive_failures == 0 and first.counters["errors"] == 1
    assert g.codes == {first.address: INVALID_ARGUMENT} and fanout.wakes == []


def test_ensemble_never_retries():
    fanout, (a, b) = policy(2)
    g = gather()
    fanout.ask(g)
    assert fanout.refused(a, g, UNAVAILABLE, "down", now=1.0) is None
    assert g.pending == {b.address: g.rid}


def test_a_deadline_exceeded_reply_counts_as_a_timeout():
    fanout, (a,) = policy(1)
    g = gather()
    fanout.ask(g)
    fanout.refused(a, g, DEADLINE_EXCEEDED, "too slow", now=1.0)
    assert g.failures == {a.address: "timeout"} and g.codes == {a.address: DEADLINE_EXCEEDED}
    assert a.counters["timeouts"] == 1 and a.counters["errors"] == 0 and a.consecutive_failures == 1


def test_an_unsent_request_counts_against_the_member_and_is_not_retried():
    fanout, (a, b) = policy(2, unhealthy_after=1)
    g = gather("replica")
    (first,) = fanout.ask(g)
    fanout.unsent(first, g, "error: send failed: full", now=1.0)
    assert g.pending == {} and g.failures == {first.address: "error: send failed: full"}
    assert not first.healthy and first.outstanding == 0 and first.counters["requests"] == 1
    assert first.counters["errors"] == 1


# ------------------------------------------------ ejection, probes, recovery


def test_a_member_is_ejected_after_unhealthy_after_failures_in_a_row():
    fanout, (a, b) = policy(2, unhealthy_after=3, probe_s=0.5)
    for now in (1.0, 2.0):
        g = gather()
        fanout.ask(g)
        fanout.refused(a, g, UNAVAILABLE, "down", now)
        fanout.answered(b, g, PROBS)
    assert a.healthy and a.consecutive_failures == 2 and fanout.wakes == []
    g = gather()
    fanout.ask(g)
    fanout.refused(a, g, UNAVAILABLE, "down", now=3.0)
    assert not a.healthy and fanout.wakes == [3.5] and fanout.next_probe_at() == 3.5
    assert fanout.ask(gather()) == [b]  # skipped from now on


def test_unhealthy_members_are_probed_every_probe_s():
    fanout, (a, b) = policy(2, unhealthy_after=1, probe_s=0.5)
    g = gather()
    fanout.ask(g)
    fanout.refused(a, g, UNAVAILABLE, "down", now=10.0)
    assert fanout.probes_due(10.4) == [] and fanout.probes_due(10.5) == [a]
    rid = fanout.probe(a, now=10.5, timeout_s=0.2)
    assert isinstance(fanout.awaiting(a, rid), Probe) and a.counters["probes"] == 1
    assert a.outstanding == 0  # a probe is not a request in flight for the choice
    assert fanout.probes_due(10.9) == [] and fanout.next_probe_at() == 11.0


def test_a_probe_answered_in_time_takes_the_member_back():
    fanout, (a, b) = policy(2, unhealthy_after=1)
    a.healthy, a.consecutive_failures, a.next_probe_at = False, 1, 1.0
    rid = fanout.probe(a, now=1.0, timeout_s=0.2)
    assert fanout.probe_answered(a, rid, 0, None, now=1.1)
    assert a.healthy and a.consecutive_failures == 0 and a.counters["recoveries"] == 1
    assert fanout.next_probe_at() is None and fanout.awaiting(a, rid) is None
    assert a in fanout.ask(gather())


def test_a_failed_or_late_probe_answer_does_not_take_the_member_back():
    fanout, (a,) = policy(1)
    a.healthy, a.next_probe_at = False, 1.0
    rid = fanout.probe(a, now=1.0, timeout_s=0.2)
    assert not fanout.probe_answered(a, rid, UNAVAILABLE, "still down", now=1.1)
    assert not a.healthy and a.last_failure == "probe: still down"
    rid = fanout.probe(a, now=1.5, timeout_s=0.2)
    assert not fanout.probe_answered(a, rid, 0, None, now=1.8)
    assert not a.healthy and a.last_failure == "probe: answered too late"


def test_a_new_probe_forgets_the_unanswered_one():
    fanout, (a,) = policy(1)
    a.healthy, a.next_probe_at = False, 1.0
    old = fanout.probe(a, now=1.0, timeout_s=0.2)
    new = fanout.probe(a, now=1.5, timeout_s=0.2)
    assert fanout.awaiting(a, old) is None and isinstance(fanout.awaiting(a, new), Probe)


# ------------------------------------------------ disconnects


def test_a_disconnected_member_is_unhealthy_and_its_requests_fail_at_once():
    fanout, (a, b) = policy(2, unhealthy_after=100, probe_s=0.5)
    gathers = [gather(), gather()]
    for g in gathers:
        fanout.ask(g)
    failed = fanout.disconnected(a, now=4.0)
    assert failed == [(g, None) for g in gathers]  # ensemble: no retries
    assert all(g.failures == {a.address: "disconnected"} and list(g.pending) == [b.address] for g in gathers)
    assert not a.healthy and a.outstanding == 0 and a.counters["errors"] == 2
    assert fanout.wakes == [4.5] and a.last_failure == "disconnected"
    assert fanout.disconnected(a, now=4.1) == [] and fanout.wakes == [4.5]  # already known


def test_a_replica_retry_after_a_disconnect_never_picks_the_disconnected_member():
    fanout, members = policy(3, unhealthy_after=100)
    a = members[0]
    gathers = []
    while len(gathers) < 3:  # three requests in flight to a (others go elsewhere)
        g = gather("replica")
        if fanout.ask(g) == [a]:
            gathers.append(g)
    busy = {m.address: m.outstanding for m in members}
    failed = fanout.disconnected(a, now=1.0)
    retries = [retry for _, retry in failed]
    assert [g for g, _ in failed] == gathers and a not in retries and None not in retries
    # each retry saw the ones before it: the load spreads over the two left
    assert sum(m.outstanding for m in members[1:]) == busy[members[1].address] + busy[members[2].address] + 3
    assert abs(members[1].outstanding - members[2].outstanding) <= 1
    assert a.outstanding == 0 and all(a.address not in g.pending for g in gathers)
    assert fanout.ask(gather("replica")) != [a]  # the idlest, but unhealthy until a probe is answered


# ------------------------------------------------ finishing


def test_at_the_deadline_every_silent_member_counts_a_timeout():
    fanout, (a, b) = policy(2, unhealthy_after=1, probe_s=0.5)
    g = gather(min_members=1)
    fanout.ask(g)
    fanout.answered(b, g, PROBS)
    fanout.forget(g, now=7.0, timed_out=True)
    assert g.failures == {a.address: "timeout"} and g.pending == {}
    assert a.counters["timeouts"] == 1 and a.outstanding == 0 and not a.healthy and fanout.wakes == [7.5]
    assert b.counters["timeouts"] == 0


def test_answered_early_what_is_still_awaited_is_forgotten_without_blame():
    fanout, (a, b) = policy(2, unhealthy_after=1)
    g = gather()
    fanout.ask(g)
    fanout.answered(b, g, PROBS)
    fanout.forget(g, now=1.0, timed_out=False)
    assert g.failures == {a.address: "not awaited"} and a.outstanding == 0
    assert a.healthy and a.counters["timeouts"] == a.counters["errors"] == 0
    assert fanout.awaiting(a, g.rid) is None  # its late reply is dropped


def test_a_cancelled_request_settles_without_blame():
    fanout, (a, b) = policy(2)
    g = gather()
    fanout.ask(g)
    fanout.cancel(g)
    assert g.pending == {} and in_flight([a, b]) == [0, 0]
    assert a.counters["errors"] == a.counters["timeouts"] == 0 and fanout.awaiting(a, g.rid) is None


def test_removing_a_member_fails_its_requests_as_removed():
    fanout, (a, b) = policy(2)
    g = gather()
    fanout.ask(g)
    member, lost = fanout.remove(a.address)
    assert member is a and lost == [g] and g.failures == {a.address: "removed"}
    assert list(g.pending) == [b.address] and fanout.ask(gather()) == [b]


def test_outstanding_counts_never_go_negative():
    fanout, (a, b) = policy(2)
    g = gather()
    fanout.ask(g)
    fanout.answered(a, g, PROBS)
    fanout.answered(a, g, PROBS)  # the same outcome fed twice settles once
    fanout.refused(b, g, UNAVAILABLE, "down", now=1.0)
    fanout.refused(b, g, UNAVAILABLE, "down", now=1.0)
    fanout.disconnected(b, now=1.0)
    fanout.forget(g, now=1.0, timed_out=True)
    fanout.cancel(g)
    assert in_flight([a, b]) == [0, 0]
    g2 = gather()
    fanout.ask(g2)
    fanout.cancel(g2)
    fanout.cancel(g2)
    fanout.forget(g2, now=1.0, timed_out=False)
    assert in_flight([a, b]) == [0, 0]
