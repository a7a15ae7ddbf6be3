"""Member health without sockets: failures in a row mark a member unhealthy, probes take it back."""

import pytest

from zmqflow.common.errors import AlreadyExistsError, DeadlineExceededError, InvalidArgumentError, NotFoundError, \
    UnavailableError
from zmqflow.services.aggregator.gather import Gather
from zmqflow.services.aggregator.members import MemberSet

pytestmark = pytest.mark.unit


def test_consecutive_failures_mark_unhealthy_and_an_answer_resets_the_count():
    ms = MemberSet(unhealthy_after=3, probe_s=0.5)
    m = ms.add("tcp://a:1")
    for _ in range(2):
        ms.sent(m)
        assert not ms.failed(m, "timeouts", "timeout", now=10.0)
    ms.sent(m)
    ms.answered(m)
    assert m.consecutive_failures == 0 and m.healthy
    for i in range(3):
        ms.sent(m)
        became = ms.failed(m, "timeouts", "timeout", now=10.0)
    assert became and not m.healthy
    assert m.counters["timeouts"] == 5 and m.counters["answers"] == 1 and m.counters["requests"] == 6
    assert ms.healthy() == [] and ms.unhealthy() == [m]


def test_client_errors_do_not_count_against_a_member():
    ms = MemberSet(unhealthy_after=1)
    m = ms.add("tcp://a:1")
    ms.sent(m)
    assert not ms.failed(m, "errors", "bad input", now=0.0, counts=False)
    assert m.healthy and m.counters["errors"] == 1


def test_unhealthy_members_are_probed_on_schedule_and_taken_back():
    ms = MemberSet(unhealthy_after=1, probe_s=0.5)
    m = ms.add("tcp://a:1")
    ms.sent(m)
    ms.failed(m, "timeouts", "timeout", now=100.0)
    assert ms.next_probe_at() == 100.5
    assert ms.probes_due(100.4) == [] and ms.probes_due(100.5) == [m]
    ms.probe_sent(m, 100.5)
    assert ms.probes_due(100.9) == [] and ms.next_probe_at() == 101.0
    ms.recovered(m)
    assert m.healthy and m.counters["recoveries"] == 1 and ms.next_probe_at() is None


def test_least_outstanding_prefers_idle_members_and_rotates_ties():
    ms = MemberSet()
    a, b, c = (ms.add(f"tcp://{n}:1") for n in "abc")
    picks = [ms.least_outstanding().address for _ in range(6)]
    assert sorted(set(picks)) == [a.address, b.address, c.address]
    a.outstanding = b.outstanding = 1  # kept by the fan-out policy (test_fanout.py)
    assert ms.least_outstanding() is c
    c.outstanding = 2
    assert ms.least_outstanding(exclude={a.address}) is b
    b.healthy = False
    assert ms.least_outstanding(exclude={a.address}) is c


def test_add_and_remove_check_their_input():
    ms = MemberSet()
    ms.add("tcp://a:1", 2.0)
    with pytest.raises(AlreadyExistsError):
        ms.add("tcp://a:1")
    with pytest.raises(InvalidArgumentError):
        ms.add("tcp://b:1", -1)
    with pytest.raises(InvalidArgumentError):
        ms.add("", 1)
    with pytest.raises(NotFoundError, match="tcp://a:1"):
        ms.remove("tcp://zzz:1")
    assert ms.remove("tcp://a:1").weight == 2.0 and len(ms) == 0
    with pytest.raises(InvalidArgumentError):
        MemberSet(unhealthy_after=0)


def test_gather_finishes_when_all_answered_or_too_few_can():
    import numpy as np
    g = Gather(None, "ensemble", "mean", 2, 0.0)
    g.asked("a", 1)
    g.asked("b", 2)
    g.skipped("c", "unhealthy")
    g.answer("a", np.ones((1, 2), np.float32), 1.0)
    assert not g.finished()
    g.fail("b", "timeout")
    assert g.finished()
    with pytest.raises(DeadlineExceededError, match="answered: a; missing: c: unhealthy; b: timeout"):
        g.outcome()
    g2 = Gather(None, "ensemble", "mean", 1, 0.0)
    g2.skipped("a", "unhealthy")
    with pytest.raises(UnavailableError, match="no healthy member"):
        g2.outcome()
    g3 = Gather(None, "ensemble", "mean", 1, 0.0)
    g3.asked("a", 1)
    g3.fail("a", "error: INVALID_ARGUMENT: bad", code=3)
    with pytest.raises(InvalidArgumentError):
        g3.outcome()


def test_busy_failures_never_take_the_healthy_below_min_healthy():
    ms = MemberSet(unhealthy_after=1, min_healthy=1)
    a, b = ms.add("tcp://a:1"), ms.add("tcp://b:1")
    assert ms.failed(a, "timeouts", "timeout", now=1.0, busy=True)       # b is still healthy
    assert not ms.failed(b, "timeouts", "timeout", now=1.0, busy=True)   # the last one: busy, not broken
    assert b.healthy and b.consecutive_failures == 1 and b.last_failure == "timeout"
    assert ms.failed(b, "errors", "error: UNAVAILABLE: down", now=1.0)   # its own error still ejects it
    assert ms.healthy() == []
    with pytest.raises(InvalidArgumentError):
        MemberSet(min_healthy=-1)
