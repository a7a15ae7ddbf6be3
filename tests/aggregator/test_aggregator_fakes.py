"""A real aggregator process over fake members (threads here): deadlines, health, late answers, membership, replicas."""

import time

import numpy as np
import pytest

from zmqflow.common.errors import (AlreadyExistsError, DeadlineExceededError, InvalidArgumentError, NotFoundError,
                           UnavailableError)
from tests.support import wait_for

pytestmark = pytest.mark.service



def x_of(value, rows=2):
    return np.full((rows, 4), value, np.float32)


def test_all_members_answer_and_are_combined(fakes, aggregator):
    members = fakes(3)
    _, client = aggregator([m.endpoint + ("=2" if i == 2 else "") for i, m in enumerate(members)])
    probs, info = client.predict(x_of(5.0))
    np.testing.assert_allclose(probs, np.full((2, 3), 6.0))  # offsets 0, 1, 2: mean 1
    assert sorted(info["answered"]) == sorted(m.endpoint for m in members) and info["missing"] == {}
    probs, _ = client.predict(x_of(5.0), combine="weighted")  # weights 1, 1, 2
    np.testing.assert_allclose(probs, np.full((2, 3), 5.0 + (0 + 1 + 4) / 4), rtol=1e-6)
    probs, _ = client.predict(x_of(5.0), combine="vote")  # every member votes class 0 (all columns tie)
    np.testing.assert_allclose(probs[:, 0], 1.0)
    stats = client.stats()
    assert stats["requests"] == 3 and stats["answered"] == 3
    assert stats["answers"] == {m.endpoint: 3 for m in members} and stats["latency_ms"]["p50"] > 0


def test_a_slow_member_is_left_out_and_the_answer_comes_at_the_deadline(fakes, aggregator):
    fast, slow = fakes(2)
    slow.delay = 2.0
    _, client = aggregator([fast, slow], "--deadline-ms", "150")
    start = time.monotonic()
    probs, info = client.predict(x_of(1.0))
    assert time.monotonic() - start >= 0.15   # not before the deadline: the slow member was waited for
    np.testing.assert_allclose(probs, np.full((2, 3), 1.0))  # the fast member's alone
    assert info["answered"] == [fast.endpoint] and info["missing"] == {slow.endpoint: "timeout"}
    assert client.stats()["timeouts"][slow.endpoint] == 1


def test_fewer_than_min_members_is_deadline_exceeded_naming_who_answered(fakes, aggregator):
    fast, slow, failing = fakes(3)
    slow.mode, failing.mode = "never", "error"
    _, client = aggregator([fast, slow, failing], "--deadline-ms", "100", "--min-members", "2")
    with pytest.raises(DeadlineExceededError) as err:
        client.predict(x_of(1.0))
    text = str(err.value)
    assert f"answered: {fast.endpoint}" in text and f"{slow.endpoint}: timeout" in text
    assert f"{failing.endpoint}: error: UNAVAILABLE" in text
    probs, info = client.predict(x_of(1.0), min_members=1)  # the request's own minimum
    assert info["answered"] == [fast.endpoint]
    stats = client.stats()
    assert stats["failed"] == 1 and stats["errors"][failing.endpoint] == 2


def test_a_flapping_member_goes_unhealthy_and_is_taken_back_after_a_probe(fakes, aggregator):
    steady, flaky = fakes(2)
    flaky.delay = 1.0
    _, client = aggregator([steady, flaky], "--deadline-ms", "80", "--unhealthy-after", "2", "--probe-every-secs", "0.1")
    for _ in range(2):
        assert client.predict(x_of(1.0))[1]["missing"] == {flaky.endpoint: "timeout"}
    probs, info = client.predict(x_of(1.0))
    assert info["missing"] == {flaky.endpoint: "unhealthy"}  # skipped, not asked and waited for
    listed = {m["address"]: m for m in client.members()}
    assert not listed[flaky.endpoint]["healthy"] and listed[flaky.endpoint]["timeouts"] == 2
    time.sleep(0.35)  # probes go unanswered in time while it is slow
    assert not {m["address"]: m for m in client.members()}[flaky.endpoint]["healthy"]
    flaky.delay = 0.0
    assert wait_for(lambda: {m["address"]: m for m in client.members()}[flaky.endpoint]["healthy"], 3.0)
    probs, info = client.predict(x_of(1.0))
    assert sorted(info["answered"]) == sorted([steady.endpoint, flaky.endpoint])
    member = {m["address"]: m for m in client.members()}[flaky.endpoint]
    assert member["recoveries"] == 1 and member["probes"] >= 2


def test_timeouts_keep_the_last_member_and_min_healthy_0_lets_them_eject_it(fakes, aggregator):
    (slow,) = fakes(1, delay=1.0)
    _, kept = aggregator([slow], "--deadline-ms", "60", "--unhealthy-after", "1", "--probe-every-secs", "0.1")
    _, ejected = aggregator([slow], "--deadline-ms", "60", "--unhealthy-after", "1", "--probe-every-secs", "0.1",
                            "--min-healthy", "0")
    for _ in range(3):  # busy, not broken: still asked each time, and answered again once it is fast
        with pytest.raises(DeadlineExceededError, match="timeout"):
            kept.predict(x_of(1.0))
    assert kept.members()[0]["healthy"] and kept.stats()["min_healthy"] == 1
    with pytest.raises(DeadlineExceededError, match="timeout"):
        ejected.predict(x_of(1.0))
    with pytest.raises(UnavailableError, match="no healthy member"):
        ejected.predict(x_of(1.0))
    slow.delay = 0.0
    assert kept.predict(x_of(1.0))[1]["answered"] == [slow.endpoint]


def test_a_request_that_waited_past_its_deadline_before_it_was_read_is_shed_at_once(fakes, aggregator):
    from zmqflow.common.errors import ResourceExhaustedError
    (member,) = fakes(1)
    _, client = aggregator([member], "--deadline-ms", "100")
    for _ in range(3):
        client.predict(x_of(1.0), deadline_ms=100)       # sent_at of each: the base of this client's clock
    seen = member.seen
    args = {"deadline_ms": 100, "sent_at": time.time() - 0.5}  # as if it had sat 500 ms in the aggregator's queue
    with pytest.raises(ResourceExhaustedError, match=r"waited 5\d\d ms before the aggregator read it") as shed:
        client.rpc.call("predict", args, [x_of(1.0)], timeout=2.0)
    assert shed.value.retry_after >= 0.5 and member.seen == seen  # never sent to the member
    assert client.stats()["shed"] == 1
    _, never_sheds = aggregator([member], "--deadline-ms", "100", "--admit-share", "0")
    never_sheds.predict(x_of(1.0), deadline_ms=100)
    assert never_sheds.rpc.call("predict", args, [x_of(1.0)], timeout=2.0)[0]["answered"] == [member.endpoint]


def test_late_answers_are_never_mixed_into_another_request(fakes, aggregator):
    fast, slow = fakes(2)
    slow.delay = lambda x: 0.25 if x[0, 0] == 10.0 else 0.3  # A's answer comes back while B waits for its own
    _, client = aggregator([fast, slow], "--deadline-ms", "1000")
    a = client.predict_async(x_of(10.0), deadline_ms=100)
    b = client.predict_async(x_of(20.0), deadline_ms=1000)
    probs_a, info_a = a.result()
    probs_b, info_b = b.result()
    np.testing.assert_allclose(probs_a, np.full((2, 3), 10.0))
    assert info_a["missing"] == {slow.endpoint: "timeout"}
    np.testing.assert_allclose(probs_b, np.full((2, 3), 20.5))  # (20 + 0) and (20 + 1): B's own answers only
    assert sorted(info_b["answered"]) == sorted([fast.endpoint, slow.endpoint])
    assert client.stats()["late_dropped"] == 1


def test_members_are_added_and_removed_while_running(fakes, aggregator):
    first, second = fakes(2)
    _, client = aggregator([first])
    added = client.add_member(second.endpoint, weight=3.0)
    assert added["address"] == second.endpoint and added["weight"] == 3.0
    probs, info = client.predict(x_of(1.0), combine="weighted")
    assert sorted(info["answered"]) == sorted([first.endpoint, second.endpoint])
    np.testing.assert_allclose(probs, np.full((2, 3), 1.75))  # (1 * 1 + 2 * 3) / 4
    with pytest.raises(AlreadyExistsError):
        client.add_member(second.endpoint)
    with pytest.raises(InvalidArgumentError):
        client.add_member("tcp://no port here")
    second.mode = "never"
    pending = client.predict_async(x_of(1.0), deadline_ms=5000)
    time.sleep(0.1)
    client.remove_member(second.endpoint)  # the request waiting on it is answered at once, without it
    probs, info = pending.result()
    assert info["missing"] == {second.endpoint: "removed"} and info["answered"] == [first.endpoint]
    assert [m["address"] for m in client.members()] == [first.endpoint]
    with pytest.raises(NotFoundError):
        client.remove_member(second.endpoint)
    client.remove_member(first.endpoint)
    with pytest.raises(UnavailableError, match="no members"):
        client.predict(x_of(1.0))


def test_replica_mode_spreads_requests_by_least_outstanding(fakes, aggregator):
    members = fakes(3, delay=0.03)
    _, client = aggregator(members, "--mode", "replica")
    pending = [client.predict_async(x_of(float(i))) for i in range(30)]
    for i, p in enumerate(pending):
        probs, info = p.result()
        assert len(info["answered"]) == 1 and info["mode"] == "replica"
        offset = [m.endpoint for m in members].index(info["answered"][0])
        np.testing.assert_allclose(probs, np.full((2, 3), i + offset))
    assert sorted(m.seen for m in members) == [10, 10, 10]  # 30 at once: each takes the next idle one
    members[0].delay = 0.5  # a busy member is passed over while its request is outstanding
    pending = [client.predict_async(x_of(1.0)) for _ in range(3)]  # one to each
    assert wait_for(lambda: [m["outstanding"] for m in client.members()] == [1, 0, 0])
    for _ in range(10):
        client.predict(x_of(1.0))
    assert members[0].seen == 11
    [p.result() for p in pending]
    assert len(client.predict(x_of(1.0), mode="ensemble", deadline_ms=2000)[1]["answered"]) == 3


def test_replica_mode_retries_a_failing_member_on_another(fakes, aggregator):
    failing, good = fakes(2)
    failing.mode = "error"
    _, client = aggregator([failing, good], "--mode", "replica", "--unhealthy-after", "100")
    for _ in range(4):
        probs, info = client.predict(x_of(1.0))
        assert info["answered"] == [good.endpoint]
    assert client.stats()["errors"][failing.endpoint] >= 1


def test_bad_requests_are_invalid_argument(fakes, aggregator):
    members = fakes(1)
    _, client = aggregator(members)
    with pytest.raises(InvalidArgumentError, match="shape"):
        client.predict(np.zeros(4, np.float32))
    with pytest.raises(InvalidArgumentError, match="combine"):
        client.predict(x_of(1.0), combine="mode")
    with pytest.raises(InvalidArgumentError, match="mode"):
        client.predict(x_of(1.0), mode="all")
    with pytest.raises(InvalidArgumentError, match="min_members"):
        client.predict(x_of(1.0), min_members=0)
    assert client.predict(x_of(1.0))[0].shape == (2, 3)
