"""Elastic sync apart from sockets: who a step aggregates when replicas join and leave mid-training."""

import numpy as np
import pytest

from zmqflow.common.errors import FailedPreconditionError, InvalidArgumentError
from zmqflow.services.ps.rules import update_rule
from zmqflow.services.ps.store import VariableStore

pytestmark = pytest.mark.unit


def store():
    return VariableStore({"w": ((2,), "float32")}, {"kind": "sgd", "learning_rate": 1.0})


def elastic_rule(**options):
    rule = update_rule(store(), "sync", elastic=True, **options)
    rule.store.initialize({"w": np.zeros(2, np.float32)})
    return rule


def push(rule, replica, value=1.0, version=None):
    version = rule.store.version if version is None else version
    return rule.push({"w": np.full(2, value, np.float32)}, version, replica)


def test_the_first_replica_joins_the_current_step_and_the_next_one_the_step_after():
    rule = elastic_rule()
    assert rule.join(0) == 0 and rule.members == {0}
    assert rule.join(1) == 1 and rule.members == {0} and rule.pending == {1: 1}
    assert push(rule, 1).reason == "not_member"          # not a member of step 0: its gradients never count
    assert push(rule, 0).applied and rule.store.version == 1
    assert rule.members == {0, 1} and rule.stats()["replicas_to_aggregate"] == 2
    assert not push(rule, 0).applied                     # step 1 waits for the replica that joined
    assert push(rule, 1, value=3.0).applied and rule.store.version == 2
    np.testing.assert_allclose(rule.store.pull()[1]["w"], [-3.0, -3.0])   # -1, then the mean of 1 and 3
    assert rule.stats()["steps_by_replicas"] == {"1": 1, "2": 1}
    assert [(c["step"], c["replicas"], c["joined"]) for c in rule.stats()["membership"]] == [(0, 1, [0]), (1, 2, [1])]


def test_a_replica_that_leaves_mid_step_completes_the_step_of_those_left():
    rule = elastic_rule()
    rule.join(0), rule.join(1)
    push(rule, 0)
    rule.join(2)
    push(rule, 0), push(rule, 2, version=rule.store.version)   # step 1: 2 is not a member yet
    assert rule.store.version == 1
    rule.worker_done(1)                                   # 0 pushed, 1 leaves: step 1 is complete
    assert rule.store.version == 2 and rule.members == {0, 2} and rule.done == {1: True}
    rule.lose_replica(2)                                  # found silent: step 2 needs 0 alone
    assert push(rule, 0).applied and rule.store.version == 3
    assert rule.stats()["steps_by_replicas"] == {"1": 3} and rule.stats()["updates"] == 3


def test_a_lost_replica_heard_from_again_is_no_member_until_it_joins_anew():
    rule = elastic_rule()
    rule.join(0), rule.join(1)
    push(rule, 0), push(rule, 1)
    rule.lose_replica(1)
    rule.heard_from(1, 0.0)
    assert push(rule, 1).reason == "not_member" and rule.members == {0}
    assert rule.join(1) == rule.store.version + 1 and 1 not in rule.lost


def test_steps_wait_below_min_replicas_and_a_join_then_counts_in_the_current_step():
    rule = elastic_rule(min_replicas=2)
    assert rule.join(0) == 0
    assert not push(rule, 0).applied and rule.store.version == 0   # one member, two needed
    assert rule.join(1) == 0                                        # admitted into step 0: it cannot go on without
    assert push(rule, 1).applied and rule.store.version == 1


def test_a_join_for_a_step_this_shard_is_past_is_refused_so_every_shard_admits_at_the_same_step():
    rule = elastic_rule()
    rule.join(0)
    push(rule, 0), push(rule, 0, version=1)
    with pytest.raises(FailedPreconditionError, match="at step 2 already"):
        rule.join(1, step=1)
    assert rule.join(1, step=2) == 2 and rule.members == {0, 1}


def test_bad_options_and_replicas_name_what_is_wrong():
    with pytest.raises(InvalidArgumentError, match="replicas_to_aggregate applies to sync mode, not to elastic"):
        elastic_rule(replicas_to_aggregate=2)
    with pytest.raises(InvalidArgumentError, match="max_replicas, not total_num_replicas"):
        elastic_rule(total_num_replicas=2)
    with pytest.raises(InvalidArgumentError, match=r"max_replicas \(1\) must be >= min_replicas \(2\)"):
        elastic_rule(min_replicas=2, max_replicas=1)
    with pytest.raises(InvalidArgumentError, match="min_replicas applies to elastic sync mode"):
        update_rule(store(), "sync", replicas_to_aggregate=1, min_replicas=2)
    with pytest.raises(InvalidArgumentError, match="elastic applies to sync mode only"):
        update_rule(store(), "async", elastic=True)
    with pytest.raises(InvalidArgumentError, match=r"in \[0, 2\) \(max_replicas\)"):
        elastic_rule(max_replicas=2).join(2)


def test_a_replica_waiting_for_a_step_that_never_comes_joins_again_into_the_current_step():
    rule = elastic_rule()
    rule.join(0)
    assert rule.join(1) == 1                      # admitted from step 1 ...
    rule.worker_done(0)                           # ... but the only member leaves before step 0 completes
    assert rule.members == set() and rule.store.version == 0
    assert rule.join(1) == 0 and rule.members == {1} and rule.pending == {}   # asked again: in at once
    assert push(rule, 1).applied and rule.store.version == 1
