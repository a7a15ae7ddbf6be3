"""Issue 27: the aggregator's memory crept while it served (54 -> 61 MB over 255,000 requests). Each parked call and
its Gather referred to each other, so only the cyclic GC freed an answered request; those still in flight at a
collection reached its oldest generation and waited there, with their tensors and frames, for a full collection
(554 answered calls at once after 345,000 requests, about 5 MB). An answered request must leave by reference
counting alone: with the collector off, nothing of it may stay, whichever way it ended.

The aggregator runs in a thread of this process (the members too), so its objects can be counted.
"""

import gc
import threading
import time

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.errors import CancelledError, DeadlineExceededError, UnavailableError
from zmqflow.common.rpc.service import Call
from zmqflow.services.aggregator.gather import Gather
from zmqflow.services.aggregator.server import Aggregator
from tests.support import wait_for

pytestmark = pytest.mark.service

ROUNDS = 50


@pytest.fixture
def collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.fixture
def serving(fakes, collector_off):
    """start(members, **options) -> a client of an aggregator run in a thread over those fake members."""
    started = []

    def start(members, **options):
        aggregator = Aggregator("tcp://127.0.0.1:*", [(m.endpoint, 1.0) for m in members], client_timeout=5.0,
                                **options)
        thread = threading.Thread(target=aggregator.run, kwargs={"install_signals": False}, daemon=True)
        thread.start()
        client = AggregatorClient(aggregator.endpoint, timeout=10.0)
        started.append((aggregator, thread, client))
        return client

    yield start
    for aggregator, thread, client in started:
        client.close()
        aggregator.stop()
        thread.join(5)


def held():
    """The Gathers alive, and the answered predict calls alive (a member's unanswered ones are its own)."""
    objects = gc.get_objects()
    return (sum(1 for o in objects if type(o) is Gather),
            sum(1 for o in objects if type(o) is Call and o.op == "predict" and o.finished))


def assert_nothing_held():
    """Nothing of an ended request alive, once the aggregator's loop has left the frames that handled the last."""
    try:
        wait_for(lambda: held() == (0, 0), timeout=2.0)
    except AssertionError:
        pass
    gathers, calls = held()
    assert (gathers, calls) == (0, 0), f"{gathers} Gathers and {calls} answered calls outlived their requests"


def x_of(value):
    return np.full((2, 4), value, np.float32)


def test_answered_requests_are_freed_without_the_cyclic_collector(fakes, serving):
    client = serving(fakes(2), deadline_ms=2000)
    for i in range(ROUNDS):
        probs, info = client.predict(x_of(float(i)))
        assert len(info["answered"]) == 2
    assert_nothing_held()


def test_requests_ended_by_their_deadline_an_error_or_a_cancel_are_freed_too(fakes, serving):
    fast, never, failing = fakes(3)
    never.mode, failing.mode = "never", "error"
    # every member asked every time (never unhealthy), nothing shed for a late read on a busy machine
    client = serving([fast, never, failing], deadline_ms=2000, unhealthy_after=1000, admit_share=0)
    for _ in range(ROUNDS // 5):
        _, info = client.predict(x_of(1.0), deadline_ms=50)   # answered at its deadline without `never`
        assert info["missing"][never.endpoint] == "timeout"
        with pytest.raises(DeadlineExceededError):             # too few answers by the deadline: failed
            client.predict(x_of(1.0), deadline_ms=50, min_members=3)
    alone = serving([never])
    for _ in range(ROUNDS // 5):
        pending = alone.predict_async(x_of(1.0), deadline_ms=5000)
        time.sleep(0.005)                                      # parked at the aggregator, then withdrawn
        pending.call.cancel()
        with pytest.raises(CancelledError):
            pending.result()
    refused = serving([failing], unhealthy_after=1000, admit_share=0)
    for _ in range(ROUNDS // 5):
        with pytest.raises(UnavailableError):                  # the member's own error, passed on
            refused.predict(x_of(1.0))
    assert_nothing_held()
