"""Admission control without sockets: a member's pace, when it is busy, and the request shed with a retry hint."""

import numpy as np
import pytest

from zmqflow.common.errors import DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE, InvalidArgumentError, \
    ResourceExhaustedError
from zmqflow.common.rpc.service import Call
from zmqflow.services.aggregator.admission import Admission, BusyRate, QueueDelay
from zmqflow.services.aggregator.fanout import FanOut
from zmqflow.services.aggregator.gather import Gather

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def paced(member, per_second, clock, seconds=1.0):
    """Make `member` look like it answered `per_second` requests/s while busy for `seconds`."""
    member.pace = BusyRate(clock=clock)
    for _ in range(int(per_second * seconds)):
        member.pace.started()
        clock.now += 1.0 / per_second
        member.pace.settled(answered=True)


def gather(mode="ensemble", deadline=10.0, min_members=1):
    return Gather(Call(b"client", 1, "predict", {}, [], deadline, 0.0), mode, "mean", min_members, 0.0)


def test_busy_rate_is_answers_per_busy_second_and_decays_when_the_member_stalls():
    clock = Clock()
    rate = BusyRate(tau_s=1.0, clock=clock)
    assert rate.per_second() is None  # nothing seen yet
    for _ in range(100):   # one request at a time, 5 ms each, with idle gaps that do not count
        rate.started()
        clock.now += 0.005
        rate.settled(answered=True)
        clock.now += 0.005
    assert rate.per_second() == pytest.approx(200, rel=0.05)
    rate.started()         # stalled: in flight, no answers
    clock.now += 3.0
    assert rate.per_second() < 10
    rate.settled(answered=False)  # a timeout is settled but does not count as an answer
    assert rate.inflight == 0 and rate.per_second() < 10


def test_a_member_is_busy_when_it_would_answer_after_its_share_of_the_time_left():
    clock, fanout = Clock(), FanOut()
    a = fanout.add("tcp://a:1")
    paced(a, 100, clock)                       # 100 answers/s: n in flight answer in (n + 1) * 10 ms
    admission = Admission(share=0.5, min_inflight=4)
    a.outstanding = 9
    assert admission.admits(a, budget_s=0.2)   # 100 ms <= 0.5 * 200 ms
    a.outstanding = 10
    assert not admission.admits(a, budget_s=0.2)
    assert 9 <= admission.retry_after_ms([a], budget_s=0.2, stalled_s=0.5) <= 11  # one answer frees a place
    a.outstanding = 3
    assert admission.admits(a, budget_s=0.0)   # under min_inflight: always, even with no time left
    assert Admission(share=0).admits(a, budget_s=0.0) and not Admission(share=0).enabled
    with pytest.raises(InvalidArgumentError):
        Admission(share=1.5)
    with pytest.raises(InvalidArgumentError):
        Admission(min_inflight=0)


def test_an_unmeasured_member_is_admitted_and_a_stalled_one_is_busy_with_the_probe_interval_as_hint():
    clock, fanout = Clock(), FanOut()
    a = fanout.add("tcp://a:1")
    a.pace = BusyRate(clock=clock)
    a.outstanding = 50
    assert Admission().admits(a, budget_s=0.1)  # no pace known yet: no evidence against it
    a.pace.started()
    clock.now += 1.0                           # a second in flight, no answer
    assert not Admission().admits(a, budget_s=0.1)
    assert Admission().retry_after_ms([a], budget_s=0.1, stalled_s=0.5) == 500


def test_ensemble_skips_busy_members_and_sheds_when_too_few_are_left():
    clock, fanout = Clock(), FanOut(admission=Admission(0.5, min_inflight=2))
    a, b, c = (fanout.add(f"tcp://{n}:1") for n in "abc")
    for member in (a, b, c):
        paced(member, 100, clock)
    b.outstanding = 20                          # 210 ms > 0.5 * 200 ms
    g = gather(deadline=clock.now + 0.2)
    assert fanout.ask(g, now=clock.now) == [a, c]
    assert g.failures == {b.address: "busy"} and b.counters["busy"] == 1 and b.address not in b.inflight
    a.outstanding = c.outstanding = 20
    g2 = gather(deadline=clock.now + 0.2, min_members=1)
    with pytest.raises(ResourceExhaustedError, match=r"overloaded: 3 of 3 healthy members are busy") as shed:
        fanout.ask(g2, now=clock.now)
    hint = shed.value.details["retry_after_ms"]
    assert 105 <= hint <= 115 and shed.value.retry_after == hint / 1000  # 110 ms until 10 of 20 are answered
    assert g2.pending == {} and [m.counters["requests"] for m in (a, b, c)] == [1, 0, 1]
    c.outstanding = 0
    with pytest.raises(ResourceExhaustedError, match="2 needed"):
        fanout.ask(gather(deadline=clock.now + 0.2, min_members=2), now=clock.now)


def test_replica_goes_to_an_admitted_member_and_sheds_when_every_one_is_busy():
    clock, fanout = Clock(), FanOut(admission=Admission(0.5, min_inflight=2))
    a, b = fanout.add("tcp://a:1"), fanout.add("tcp://b:1")
    for member in (a, b):
        paced(member, 100, clock)
    a.outstanding, b.outstanding = 5, 30
    assert fanout.ask(gather("replica", deadline=clock.now + 0.2), now=clock.now) == [a]
    a.outstanding = 30
    with pytest.raises(ResourceExhaustedError):
        fanout.ask(gather("replica", deadline=clock.now + 0.2), now=clock.now)
    a.healthy = b.healthy = False               # none healthy: not overload, the usual 'no healthy member'
    g = gather("replica", deadline=clock.now + 0.2)
    assert fanout.ask(g, now=clock.now) == [] and g.failures == {a.address: "unhealthy", b.address: "unhealthy"}


def test_a_replica_retry_skips_busy_members():
    clock, fanout = Clock(), FanOut(admission=Admission(0.5, min_inflight=2))
    a, b, c = (fanout.add(f"tcp://{n}:1") for n in "abc")
    paced(a, 100, clock)
    paced(b, 10, clock)                         # slow: 5 in flight answer in 600 ms
    paced(c, 100, clock)                        # 8 in flight answer in 90 ms
    b.outstanding, c.outstanding = 5, 8
    g = gather("replica", deadline=clock.now + 0.2)
    assert fanout.ask(g, now=clock.now) == [a]
    assert fanout.refused(a, g, UNAVAILABLE, "down", now=clock.now) is c  # b holds fewer, but is busy


# ------------------------------------------------ the ejection floor


def test_timeouts_never_eject_the_last_healthy_members_but_errors_and_disconnects_do():
    fanout = FanOut(unhealthy_after=1, min_healthy=1, admission=Admission(0))
    a, b, c = (fanout.add(f"tcp://{n}:1") for n in "abc")
    for _ in range(5):                          # every member times out, again and again: overload
        g = gather()
        fanout.ask(g, now=1.0)
        fanout.forget(g, now=2.0, timed_out=True)
    assert [m.healthy for m in (a, b, c)].count(True) == 1  # two ejected, the floor kept one
    (last,) = fanout.members.healthy()
    assert last.counters["timeouts"] == 5 and last.consecutive_failures == 5
    g = gather()
    fanout.ask(g, now=3.0)
    fanout.refused(last, g, RESOURCE_EXHAUSTED, "member full", now=3.0)  # load too: busy, kept
    assert last.healthy
    fanout.refused(last, g, DEADLINE_EXCEEDED, "late", now=3.0)
    assert last.healthy
    g = gather()
    fanout.ask(g, now=4.0)
    fanout.refused(last, g, UNAVAILABLE, "broken", now=4.0)  # an error of its own: ejected, floor or not
    assert not last.healthy and fanout.members.healthy() == []


def test_the_floor_is_configurable_and_a_disconnect_ignores_it():
    fanout = FanOut(unhealthy_after=1, min_healthy=2, admission=Admission(0))
    a, b, c = (fanout.add(f"tcp://{n}:1") for n in "abc")
    for _ in range(3):
        g = gather()
        fanout.ask(g, now=1.0)
        fanout.forget(g, now=2.0, timed_out=True)
    assert len(fanout.members.healthy()) == 2
    for member in fanout.members.healthy():
        fanout.disconnected(member, now=3.0)
    assert fanout.members.healthy() == []


def test_a_lone_member_that_only_times_out_is_kept_healthy_and_not_probed():
    fanout = FanOut(unhealthy_after=1, admission=Admission(0))
    a = fanout.add("tcp://a:1")
    g = gather()
    fanout.ask(g, now=1.0)
    fanout.forget(g, now=2.0, timed_out=True)
    assert a.healthy and a.counters["timeouts"] == 1 and fanout.next_probe_at() is None
    g = gather()
    assert fanout.ask(g, now=3.0) == [a]        # still asked: it answers once the load is gone
    fanout.answered(a, g, np.ones((1, 2), np.float32))
    assert a.consecutive_failures == 0 and a.counters["answers"] == 1


# ------------------------------------------------ time waited before the aggregator read a request


def test_queue_delay_cancels_each_clients_clock_offset():
    delay = QueueDelay(window_s=10.0)
    assert delay.waited(b"a", sent_at=1000.0, now=5.0) == 0.0          # a's clock is 995 s ahead: its base
    assert delay.waited(b"b", sent_at=2.0, now=5.001) == 0.0           # b's is 3 s behind: its own base
    assert delay.waited(b"a", sent_at=1001.0, now=6.08) == pytest.approx(0.08)
    assert delay.waited(b"b", sent_at=3.0, now=6.0) == 0.0              # quicker than before: the new base
    assert delay.waited(b"b", sent_at=4.0, now=7.05) == pytest.approx(0.05)
    assert delay.waited(b"a", sent_at=1030.0, now=35.0) == 0.0          # windows later, the old base is gone
