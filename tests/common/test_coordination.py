"""Coordinator and QueueRunner as TensorFlow's: producers written by the user fill a queue on a real
broker, the queue closes after the last one ends, and a failing producer stops everyone with its
error and cancels the queue so no consumer waits for data that will not come."""

import itertools
import threading

import numpy as np
import pytest

import zmqflow
from zmqflow.common.errors import CancelledError, OutOfRangeError
from zmqflow.common.clients.queues import FIFOQueue

pytestmark = pytest.mark.service


def rows_producer(start, batches, rows=10):
    counter = itertools.count()

    def produce():
        k = next(counter)
        if k == batches:
            return None
        base = start + k * rows
        return {"input": np.arange(base, base + rows, dtype=np.float32).reshape(rows, 1),
                "label": np.arange(base, base + rows, dtype=np.int32)}
    return produce


def queue(broker, name):
    return FIFOQueue(1000, ["float32", "int32"], [[1], []], names=["input", "label"], shared_name=name,
                     broker=broker)


def test_producers_fill_the_queue_and_the_last_one_closes_it(broker):
    q = queue(broker, "coord-ok")
    coord = zmqflow.Coordinator()
    runner = zmqflow.QueueRunner(q, [rows_producer(0, 5), rows_producer(1000, 3)])
    threads = runner.create_threads(coord, start=True)
    coord.join(threads, stop_grace_period_secs=10)
    labels = []
    while True:
        try:
            labels += q.dequeue_up_to(64, timeout=5)["label"].tolist()
        except OutOfRangeError:
            break
    assert sorted(labels) == list(range(50)) + list(range(1000, 1030))   # nothing lost, then the end


def test_a_failing_producer_stops_every_thread_and_cancels_the_queue(broker):
    q = queue(broker, "coord-fail")
    coord = zmqflow.Coordinator()
    healthy = rows_producer(0, 10_000)
    calls = itertools.count()

    def broken():
        if next(calls) == 2:
            raise ValueError("row 21 of my_file.csv is not a number")
        return healthy()

    threads = zmqflow.QueueRunner(q, [broken, rows_producer(5000, 10_000)]).create_threads(coord, start=True)
    with pytest.raises(ValueError, match="row 21 of my_file.csv"):
        coord.join(threads, stop_grace_period_secs=10)
    assert coord.should_stop() and not any(t.is_alive() for t in threads)
    assert q.is_closed()
    with pytest.raises((OutOfRangeError, CancelledError)):
        while True:
            q.dequeue_many(5, timeout=5)


def test_coordinator_stop_on_exception_and_clean_stops():
    coord = zmqflow.Coordinator()
    with coord.stop_on_exception():
        raise OutOfRangeError("the end of the input")     # a clean stop: join raises nothing
    assert coord.should_stop() and coord.wait_for_stop(0)
    coord.join([], stop_grace_period_secs=1)
    coord.clear_stop()
    stuck = threading.Event()
    thread = threading.Thread(target=stuck.wait, args=(5,), daemon=True)
    thread.start()
    coord.request_stop()
    with pytest.raises(RuntimeError, match="did not stop within 0.2 s"):
        coord.join([thread], stop_grace_period_secs=0.2)
    stuck.set()
