"""A queue's registered producers (queues/producers.py): the broker closes the queue after the last one
is done and fails it, for every consumer, when one vanishes or fails. The rules as plain code first,
then over ZeroMQ with real clients: a dropped connection and a silent producer."""

import subprocess
import sys
import time

import numpy as np
import pytest

from zmqflow.common.clients import queues
from zmqflow.common.errors import (ABORTED, AbortedError, CancelledError, DataLossError, FailedPreconditionError,
                                   InvalidArgumentError, OutOfRangeError)
from zmqflow.common.clients.producers import Producer
from zmqflow.common.wire.protocol import BrokerOps
from zmqflow.services.broker.queues import QUEUE_CLASSES, QueueDeclaration, Ticket
from zmqflow.services.broker.queues.producers import ProducerBook

pytestmark = pytest.mark.service

A, B, C = b"client-a", b"client-b", b"client-c"


def make(name="q", capacity=100):
    decl = QueueDeclaration("FIFOQueue", capacity, ["int32"], [[]])
    decl.validate()
    return QUEUE_CLASSES["FIFOQueue"](decl, name)


def fill(q, *values):
    t = Ticket("enqueue_many", [np.array(values, np.int32)])
    q.submit(t)
    assert t.done and t.error is None


def take(q, n):
    t = Ticket("dequeue_up_to", [], n=n)
    q.submit(t)
    return t


def registered(*names, at_least_once=False, source=None, lease=1.0):
    book, q = ProducerBook(), make()
    for owner, name in zip((A, B, C), names):
        book.register(q, owner, name, lease, 0.0, at_least_once, 5.0, source)
    return book, q


@pytest.mark.unit
def test_the_first_producer_is_first_and_only_the_last_one_done_closes():
    book, q = registered("a", "b", "c")
    fill(q, 1, 2)
    assert book.state(q)["first"] == "a"
    assert book.done(q, B, "b", 1.0, True, None, 0.1)[0]["closed"] is None
    assert book.done(q, A, "a", 1.0, True, None, 0.2)[0]["closed"] is None and not q.is_closed()
    state, done = book.done(q, C, "c", 1.0, True, None, 0.3)
    assert state["closed"] == "ok" and state["closed_by"] == "c" and q.is_closed()
    assert take(q, 5).result[0].tolist() == [1, 2]             # closing keeps what is stored (TF)
    assert isinstance(take(q, 5).error, OutOfRangeError)


@pytest.mark.unit
def test_one_registering_after_the_close_registers_nothing_and_one_before_is_waited_for():
    book, q = registered("a")
    book.register(q, B, "late-but-before", 1.0, 0.0)
    book.done(q, A, "a", 1.0, True, None, 0.1)
    assert not q.is_closed()                                    # the second may still push
    assert book.done(q, B, "late-but-before", 1.0, True, None, 0.2)[0]["closed"] == "ok"
    state = book.register(q, C, "after", 1.0, 0.3)
    assert state["closed"] == "ok" and "after" not in state["producers"]


@pytest.mark.unit
def test_producers_that_left_early_fail_the_queue_unless_one_saw_the_end():
    book, q = registered("a", "b")
    book.done(q, A, "a", 1.0, False, None, 0.1)
    state, _ = book.done(q, B, "b", 1.0, False, None, 0.2)
    assert state["closed"] == "failed" and "every producer left before the input was exhausted" in state["error"]
    with pytest.raises(CancelledError, match="the rest of the input would be lost"):
        raise take(q, 1).error
    book, q = registered("a", "b")
    book.done(q, A, "a", 1.0, False, None, 0.1)               # stopped between files: b reads the rest
    assert book.done(q, B, "b", 1.0, True, None, 0.2)[0]["closed"] == "ok"


@pytest.mark.unit
def test_a_failure_is_kept_once_and_raised_to_consumers_producers_and_whoever_registers():
    book, q = registered("a", "b")
    fill(q, 1, 2, 3)
    waiting = Ticket("enqueue_many", [np.arange(200, dtype=np.int32)])
    q.submit(waiting)                                          # blocked on a full queue
    state, done = book.fail(q, B, "b", 15, "shard-3.csv: corrupted record at offset 10")
    assert state["closed"] == "failed" and state["closed_by"] == "b" and waiting in done
    assert isinstance(waiting.error, DataLossError)            # the enqueue gets the failure too
    assert book.fail(q, A, "a", ABORTED, "later")[0]["error"].startswith("shard-3")   # the first stays
    with pytest.raises(DataLossError, match="shard-3"):
        raise take(q, 1).error                                 # elements stored are not handed out
    assert q.held_bytes == 0 and q.size() == 0
    with pytest.raises(DataLossError):
        book.register(q, C, "c", 1.0, 1.0)


@pytest.mark.unit
def test_a_producer_is_gone_when_its_connection_drops_or_it_is_silent_past_its_lease():
    book, q = registered("a", "b", lease=2.0)
    waiting = take(q, 10)
    assert book.next_expiry == 2.0
    book.beat(q, B, "b", 2.0, {"reading": ["shard-1.csv"], "instances": 50, "files_done": 1}, 1.5)
    assert book.expire(1.9) == [] and book.state(q)["closed"] is None
    assert waiting in book.expire(2.0)
    state = book.state(q)
    assert state["closed"] == "failed" and "a stopped beating for 2.0 s (silent past its lease; lease 2 s) " \
                                           "between files" in state["error"]
    assert waiting.done and isinstance(waiting.error, AbortedError)
    book, q = registered("a", "b", lease=2.0)
    book.beat(q, B, "b", 2.0, {"reading": ["shard-1.csv"], "instances": 50, "files_done": 1}, 0.5)
    book.gone(B, 0.7)
    assert "b stopped beating for 0.2 s (its connection dropped; lease 2 s) while reading shard-1.csv; it had " \
           "pushed 50 instances of 1 finished files" in book.state(q)["error"]
    book, q = registered("a")
    book.done(q, A, "a", 2.0, True, None, 0.5)
    assert book.gone(A, 0.6) == [] and book.expire(10.0) == [] and book.state(q)["closed"] == "ok"


@pytest.mark.unit
def test_at_least_once_a_gone_producer_is_dropped_and_the_last_exhausted_one_left_closes():
    names = make("q.filenames")
    names.submit(Ticket("close"))                              # the first producer had pushed every name
    book, q = registered("a", "b", at_least_once=True, source=names)
    with pytest.raises(InvalidArgumentError, match="c is not at-least-once, the first producer of queue 'q' was"):
        book.register(q, C, "c", 1.0, 0.0)
    book.done(q, A, "a", 1.0, True, None, 0.1)
    book.gone(B, 0.2)
    state = book.state(q)
    assert state["closed"] == "ok" and list(state["producers"]) == ["a"] and q.is_closed()


@pytest.mark.unit
def test_at_least_once_the_first_producer_gone_before_its_source_closed_fails_the_queue_and_the_source():
    names = make("q.filenames")
    book, q = registered("a", "b", at_least_once=True, source=names)
    book.gone(A, 0.2)
    assert book.state(q)["closed"] == "failed"
    with pytest.raises(AbortedError, match="a stopped beating"):
        raise take(names, 1).error                             # the other readers stop taking names


@pytest.mark.unit
def test_at_least_once_with_every_producer_gone_the_queue_waits_for_one_then_fails():
    names = make("q.filenames")
    names.submit(Ticket("close"))
    book, q = registered("a", at_least_once=True, source=names)
    book.gone(A, 1.0)
    assert book.state(q)["closed"] is None and book.next_expiry == 6.0   # rejoin_s 5
    book.register(q, B, "again", 1.0, 2.0, at_least_once=True)   # one joined in time: no failure
    assert book.expire(6.5) == [] and book.state(q)["closed"] is None
    book.beat(q, B, "again", 1.0, None, 6.6)
    book.done(q, B, "again", 1.0, False, None, 7.0)            # it left early too
    book.expire(12.1)
    assert "no live reader left and its input is not exhausted: every producer is gone, and none joined again " \
           "within 5 s" in book.state(q)["error"]


@pytest.mark.unit
def test_at_least_once_a_producer_dropped_as_silent_is_one_again_at_its_next_beat():
    names = make("q.filenames")
    names.submit(Ticket("close"))
    book, q = registered("a", "b", at_least_once=True, source=names)
    book.beat(q, A, "a", 1.0, None, 0.9)
    book.expire(1.0)                                           # b silent past its lease: dropped
    assert list(book.state(q)["producers"]) == ["a"]
    book.beat(q, B, "b", 1.0, {"instances": 5}, 1.2)
    assert book.state(q)["producers"]["b"]["progress"] == {"instances": 5}
    book.done(q, A, "a", 1.0, True, None, 1.3)
    assert book.state(q)["closed"] is None                     # b holds the close up again
    book, q = registered("x")
    with pytest.raises(FailedPreconditionError, match="stranger is not a producer of queue 'q'"):
        book.beat(q, C, "stranger", 1.0, None, 0.0)            # not at least once: never registered


# ------------------------------------------------------------------ over ZeroMQ


def fifo(broker, name, capacity=10):
    return queues.FIFOQueue(capacity, ["int32"], shapes=[[]], shared_name=name, container="producers",
                            broker=broker)


def test_the_last_producer_done_closes_the_queue_for_its_consumers(broker):
    queue = fifo(broker, "closes")
    first = Producer(queue, lease=2.0, name="reader@here:1")
    second = queues.attach("closes", "producers", broker, role="producer", lease=2.0, name="reader@here:2").producer
    assert first.first and not second.first
    queue.enqueue_many([[1, 2, 3]])
    assert first.done().get("closed") is None and not queue.is_closed()
    assert second.done()["closed"] == "ok" and queue.is_closed()
    assert queue.dequeue_up_to(5, timeout=5).tolist() == [1, 2, 3]
    with pytest.raises(OutOfRangeError):
        queue.dequeue(timeout=5)
    state = queue.producers()
    assert state["closed_by"] == "reader@here:2" and all(p["done"] for p in state["producers"].values())
    for producer in (first, second):
        producer.close()


def test_a_producer_process_killed_fails_the_queue_at_once_for_a_waiting_consumer(broker):
    queue = fifo(broker, "killed")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from zmqflow.common.clients import queues\n"
        "q = queues.attach('killed', 'producers', sys.argv[1], role='producer', lease=30, name='reader@gone:7')\n"
        "q.producer.beat({'reading': ['shard-4.csv'], 'instances': 9})\n"
        "print('registered', flush=True)\n"
        "time.sleep(60)\n"), broker], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "registered"
        waiting = queue.dequeue_async(timeout=20)
        holder.kill()
        killed = time.monotonic()
        with pytest.raises(AbortedError, match=r"reader@gone:7 stopped beating .*its connection dropped; lease 30 s\) "
                                               r"while reading shard-4.csv"):
            waiting.result()
        took = time.monotonic() - killed
    finally:
        holder.kill()
        holder.wait(5)
    print(f"\na producer SIGKILLed with a lease of 30 s: its consumer failed {took * 1000:.0f} ms later")
    assert took < 2.0 and queue.producers()["closed"] == "failed"
    with pytest.raises(AbortedError):
        queue.enqueue(4, timeout=5)                             # producers get it too


def test_a_silent_producer_fails_the_queue_after_its_lease(broker):
    queue = fifo(broker, "silent")
    producer = Producer(queue, lease=0.5, name="reader@stuck:1")
    started = time.monotonic()
    with pytest.raises(AbortedError, match=r"reader@stuck:1 stopped beating for 0.\d s \(silent past its lease; "
                                           r"lease 0.5 s\) between files"):
        queue.dequeue(timeout=10)
    took = time.monotonic() - started
    assert 0.45 < took < 1.5
    assert producer.beat()["closed"] == "failed" and isinstance(producer.error(), AbortedError)
    producer.close()


def test_bad_producer_requests_are_refused_by_name(broker):
    queue = fifo(broker, "bad")
    with pytest.raises(InvalidArgumentError, match="lease"):
        Producer(queue, lease=0)
    with pytest.raises(InvalidArgumentError, match="role must be"):
        queues.attach("bad", "producers", broker, role="owner")
    producer = Producer(queue, lease=2.0)
    with pytest.raises(InvalidArgumentError, match="error 'code'"):
        producer._call(BrokerOps.ProducerFailed, code=0, error="fine")
    with pytest.raises(InvalidArgumentError, match="progress"):
        producer.beat(progress=[1, 2])
    producer.close()
