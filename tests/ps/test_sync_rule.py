"""The rules' parked pulls and replicas apart from sockets: parked pulls, finished and lost replicas, release."""

import numpy as np
import pytest

from zmqflow.services.ps.rules import ANSWER, PARK, RELEASE, update_rule
from zmqflow.services.ps.store import VariableStore

pytestmark = pytest.mark.unit

PIECES = {"w": ((2,), "float32")}


def sync_rule(replicas_to_aggregate=2, total_num_replicas=None, mode="sync", **options):
    if mode == "sync":
        options.update(replicas_to_aggregate=replicas_to_aggregate, total_num_replicas=total_num_replicas)
    rule = update_rule(VariableStore(PIECES, {"kind": "sgd", "learning_rate": 0.1}), mode, **options)
    rule.store.initialize({"w": np.zeros(2, np.float32)})
    return rule


def push(rule, replica, version=None):
    return rule.push({"w": np.ones(2, np.float32)}, rule.store.version if version is None else version, replica)


class Call:
    def __init__(self, name):
        self.name, self.finished = name, False


def test_a_pull_for_the_current_or_an_old_version_is_answered_at_once():
    sync = sync_rule()
    assert sync.on_pull(None) == ANSWER and sync.on_pull(0) == ANSWER


def test_a_pull_for_the_next_step_parks_until_the_step_completes():
    sync = sync_rule(replicas_to_aggregate=2)
    assert sync.on_pull(1) == PARK
    waiter = Call("worker0")
    sync.park(waiter, 1)
    push(sync, 0)
    assert sync.due() == [] and sync.parked == 1          # one of two replicas: the step is not complete
    push(sync, 1)
    assert sync.store.version == 1 and sync.due() == [waiter] and sync.parked == 0


def test_waiters_for_a_later_step_stay_parked():
    sync = sync_rule(replicas_to_aggregate=1)
    now, later = Call("now"), Call("later")
    sync.park(now, 1)
    sync.park(later, 2)
    push(sync, 0)
    assert sync.due() == [now] and sync.parked == 1


def test_a_cancelled_waiter_is_dropped_not_answered():
    sync = sync_rule(replicas_to_aggregate=1, live=lambda call: not call.finished)
    gone, waiting = Call("gone"), Call("waiting")
    sync.park(gone, 1)
    sync.park(waiting, 1)
    gone.finished = True
    push(sync, 0)
    assert sync.due() == [waiting]


def test_when_fewer_replicas_are_left_than_a_step_needs_every_parked_pull_is_released():
    sync = sync_rule(replicas_to_aggregate=2, total_num_replicas=3)
    first, second = Call("a"), Call("b")
    sync.park(first, 1)
    sync.park(second, 1)
    assert sync.worker_done(2) == []                      # 2 of 3 left: a step can still complete
    assert sync.worker_done(1) == [first, second]         # 1 left, 2 needed: released
    assert sync.on_pull(1) == RELEASE and sync.parked == 0  # later pulls are not parked at all


def test_spare_replicas_finishing_do_not_release_the_step():
    sync = sync_rule(replicas_to_aggregate=2, total_num_replicas=4)
    sync.park(Call("a"), 1)
    assert sync.worker_done(3) == [] and sync.worker_done(2) == [] and sync.parked == 1
    assert not sync.step_cannot_complete()


@pytest.mark.parametrize("done_first", [True, False])
def test_a_replica_the_shard_lost_and_one_done_leave_too_few_and_release_the_step(done_first):
    """A SIGKILLed spare found silent by the shard (its lost set), the other non-chief done with its input:
    the chief alone cannot complete a step of 2, whichever came first (it used to wait 30 s)."""
    sync = sync_rule(replicas_to_aggregate=2, total_num_replicas=3)
    chief = Call("chief")
    sync.park(chief, 1)
    if done_first:
        assert sync.worker_done(1) == []                   # 2 left (one of them silent, not yet lost)
        sync.lose_replica(2)
        assert sync.step_cannot_complete() and sync.release_all() == [chief]
    else:
        sync.lose_replica(2)
        assert not sync.step_cannot_complete()              # 2 left, 2 needed
        assert sync.worker_done(1) == [chief]
    assert sync.on_pull(1) == RELEASE


def test_a_lost_replica_that_reports_after_all_is_done_not_lost():
    sync = sync_rule(replicas_to_aggregate=1, total_num_replicas=3)
    sync.worker_done(2, lost=True)
    assert sync.given_up() == [2] and set(sync.done) == {2}
    sync.worker_done(2)
    assert sync.given_up() == [] and set(sync.done) == {2}
    sync.worker_done(1)
    sync.worker_done(1, lost=True)                         # already done by itself: not lost
    assert sync.given_up() == []


def test_async_mode_never_releases_and_answers_old_versions():
    sync = sync_rule(mode="async")
    assert sync.worker_done(0) == [] and not sync.step_cannot_complete()
    assert sync.on_pull(5) == PARK


def test_release_all_answers_every_waiter_once():
    sync = sync_rule()
    waiters = [Call(str(i)) for i in range(3)]
    for waiter in waiters:
        sync.park(waiter, 1)
    assert sync.release_all() == waiters and sync.release_all() == [] and sync.parked == 0


def test_idle_seconds_per_replica():
    sync = sync_rule()
    sync.heard_from(0, now=10.0)
    sync.heard_from(1, now=12.0)
    assert sync.idle_seconds(now=13.0) == {0: 3.0, 1: 1.0}
