"""A worker's at-least-once bookkeeping against a real broker: kept while held, acked after the push, given back."""

import time

import numpy as np
import pytest

from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.services.worker.build import training_input
from zmqflow.services.worker.config import UsageError, WorkerConfig
from zmqflow.services.worker.leased_batches import MIN_LEASE_S, STEP_FACTOR, LeasedBatches

pytestmark = pytest.mark.service


def queue_of(broker, name, rows=10):
    queue = FIFOQueue(100, ["int32"], shapes=[[]], shared_name=name, broker=broker)
    queue.enqueue_many([np.arange(rows, dtype=np.int32)], timeout=5)
    return queue


def counts(broker, name):
    with BrokerClient(broker) as client:
        return next(q for q in client.list_queues() if q["name"] == name)


def test_a_held_batch_is_extended_then_acked_once_its_push_is_settled(broker):
    queue = queue_of(broker, "leased-batches")
    leases = LeasedBatches(lease_s=0.6)
    values = leases.arrived(queue.dequeue_up_to(4, timeout=5, lease=leases.length()))
    assert values.tolist() == [0, 1, 2, 3]
    time.sleep(0.4)
    leases.keep()                                  # past half its 0.6 s: extended
    time.sleep(0.4)                                # 0.8 s after the grant: still held
    assert counts(broker, "leased-batches")["leased"] == 4
    leases.pushed()
    assert counts(broker, "leased-batches")["lease_acked"] == 0    # not before the ps acknowledged the push
    leases.push_settled()
    state = counts(broker, "leased-batches")
    assert state["lease_acked"] == 4 and state["leased"] == 0 and leases.acked == 4


def test_a_lost_step_gives_its_batches_back(broker):
    queue = queue_of(broker, "given-back")
    leases = LeasedBatches()
    leases.arrived(queue.dequeue_up_to(4, timeout=5, lease=leases.length()))
    leases.pushed()
    leases.arrived(queue.dequeue_up_to(4, timeout=5, lease=leases.length()))
    leases.give_back()                             # the ps went away: the push in flight and the batch in hand
    state = counts(broker, "given-back")
    assert state["lease_returned"] == 8 and state["size"] == 10 and leases.returned == 8


@pytest.mark.unit
def test_the_default_lease_follows_the_slowest_step():
    leases = LeasedBatches()
    assert leases.length() == MIN_LEASE_S
    leases.step_took(3.0)
    assert leases.length() == STEP_FACTOR * 3.0 and LeasedBatches(lease_s=7).length() == 7


@pytest.mark.unit
def test_at_least_once_with_preloaded_input_is_a_usage_error():
    config = WorkerConfig(ps_endpoints=("tcp://127.0.0.1:1",), preloaded="train", at_least_once=True)
    with pytest.raises(UsageError, match="--at-least-once leases batches of a broker queue"):
        training_input(config, ps=None)
