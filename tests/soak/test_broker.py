"""Soak: a broker driven at full rate by batches of MNIST rows (313 KB each) in and out of a FIFO queue and a shuffle
queue, each batch by one of the ways an element leaves (a plain dequeue_many, dequeue_up_to, a leased dequeue then
its ack, a dequeue parked on the empty queue until the next enqueue), while a producer stays parked on a full queue
with the earliest deadline, as a reader's file-name producer does. Issue 27: with that producer at the head of its
deadline heap, the broker kept every answered call and the batch it carried (17.7 GB after a 214 s job); the soak
fails on that code within seconds.
"""

import time
import uuid

import numpy as np
import pytest

from zmqflow.common.clients import queues
from zmqflow.common.errors import CancelledError
from zmqflow.common.clients.queues import FIFOQueue, RandomShuffleQueue
from tests.support.soak import Sampler, check, soak_seconds, soak_timeout

pytestmark = [pytest.mark.service, pytest.mark.soak, pytest.mark.timeout(soak_timeout())]

BATCH, ROW = 100, 784
PATHS = ("dequeue_many", "dequeue_up_to", "leased", "parked")
TIMEOUT = 60


def one_batch_through(queue, path, batch):
    """`batch` in, one batch out of `queue` by `path`."""
    queue.enqueue_many(batch, timeout=TIMEOUT)
    if path == "dequeue_many":
        x, y = queue.dequeue_many(BATCH, timeout=TIMEOUT)
    elif path == "dequeue_up_to":
        x, y = queue.dequeue_up_to(BATCH, timeout=TIMEOUT)
    elif path == "leased":
        lease = queue.dequeue_many(BATCH, timeout=TIMEOUT, lease=30)
        x, y = lease.values
        lease.ack()
    else:  # the queue is empty now: this dequeue parks, and the next enqueue answers it
        queue.dequeue_many(BATCH, timeout=TIMEOUT)   # takes the batch just enqueued
        parked = queue.dequeue_many_async(BATCH, timeout=TIMEOUT)
        queue.enqueue_many(batch, timeout=TIMEOUT)
        x, y = parked.result()
    assert x.shape == (BATCH, ROW) and y.shape == (BATCH,)


def test_broker(processes):
    seconds = soak_seconds()
    broker = processes.service("zmqflow.services.broker", [])
    container = f"soak-{uuid.uuid4().hex[:8]}"
    names = FIFOQueue(1, "string", shapes=[[]], shared_name="names", container=container, broker=broker.endpoint)
    names.enqueue(np.array(b"first", object), timeout=5)
    producer = names.enqueue_async(np.array(b"second", object), timeout=seconds + 120)   # parked: the heap's head
    declaration = dict(dtypes=["float32", "int32"], shapes=[[ROW], []], container=container, broker=broker.endpoint)
    targets = [FIFOQueue(BATCH * 10, shared_name="fifo", **declaration),
               RandomShuffleQueue(BATCH * 10, 0, shared_name="shuffle", **declaration)]
    batch = [np.random.default_rng(0).random((BATCH, ROW), dtype=np.float32), np.arange(BATCH, dtype=np.int32)]
    rounds = 0
    with Sampler({"broker": broker.pid}) as sampler:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            one_batch_through(targets[rounds % 2], PATHS[(rounds // 2) % len(PATHS)], batch)
            rounds += 1
    assert not producer.wait(0), "the parked producer was answered: the heap's head moved"
    queues.reset(container, broker=broker.endpoint)
    with pytest.raises(CancelledError):
        producer.result()
    check("broker", sampler, rounds, f"batches of {BATCH} rows ({rounds * sum(a.nbytes for a in batch) / 2 ** 20:.0f} "
          "MB) through", seconds)
