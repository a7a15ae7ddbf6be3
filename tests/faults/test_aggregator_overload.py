"""Issue: overload ejected every aggregator member at once (their timeouts looked like failures), and
then every request failed with 'no healthy member'. Now timeouts never eject the last healthy
members, and requests the members cannot answer by their deadline are shed at once with
RESOURCE_EXHAUSTED and a retry hint.

A real aggregator over 3 members of fixed capacity (one request at a time, 10 ms each: an ensemble
answers at most 100 requests/s) is driven open-loop at 2.5x that for 3 s, then at half of it for
3 s. Measured and printed: goodput while overloaded, how fast shed requests were answered, and how
long after the load dropped every request was answered again.
"""

import threading
import time

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.loadtest.open_loop import SHED, run_phases
from tests.aggregator.fakes import FakeMember

pytestmark = pytest.mark.faults

SERVICE_S = 0.010
CAPACITY = 1 / SERVICE_S   # requests/s: every member serves every request of the ensemble
DEADLINE_MS = 200
OVER_S, UNDER_S = 3.0, 3.0


class HealthyWatch(threading.Thread):
    """The fewest healthy members the aggregator listed, sampled every 50 ms until stopped."""

    def __init__(self, address):
        super().__init__(daemon=True)
        self.address, self.fewest, self.samples = address, None, 0
        self._done = threading.Event()

    def run(self):
        with AggregatorClient(self.address, timeout=2.0, name="healthy-watch") as client:
            while not self._done.wait(0.05):
                healthy = sum(m["healthy"] for m in client.members())
                self.fewest = healthy if self.fewest is None else min(self.fewest, healthy)
                self.samples += 1

    def stop(self):
        self._done.set()
        self.join(5.0)


def test_overload_is_shed_fast_and_never_ejects_every_member(processes):
    members = [FakeMember(offset=float(i), service_s=SERVICE_S).start() for i in range(3)]
    watch = None
    try:
        aggregator = processes.service("zmqflow.services.aggregator", [
            *[a for m in members for a in ("--member", m.endpoint)],
            "--deadline-ms", str(DEADLINE_MS), "--unhealthy-after", "3", "--probe-every-secs", "0.1"])
        x = np.random.default_rng(0).random((1, 4), dtype=np.float32)
        with AggregatorClient(aggregator.endpoint, timeout=5.0, name="overload") as client:
            client.predict(x)  # connected and warm
            watch = HealthyWatch(aggregator.endpoint)
            watch.start()
            run = run_phases(lambda: client.predict_async(x, deadline_ms=DEADLINE_MS), client.rpc.poll,
                             [(2.5 * CAPACITY, OVER_S), (0.5 * CAPACITY, UNDER_S)], drain_s=2.0)
            watch.stop()
            stats = client.stats()
    finally:
        if watch is not None:
            watch.stop()
        for member in members:
            member.shutdown()

    over = [o for o in run.outcomes if o.due < OVER_S]
    good = [o for o in over if o.error is None and o.latency_ms <= DEADLINE_MS]
    shed = [o for o in over if o.error == SHED]
    partial = sum(1 for o in good if o.info.get("missing"))  # busy members skipped: answered by fewer
    goodput = len(good) / OVER_S
    shed_ms = np.percentile([o.latency_ms for o in shed], 99) if shed else None
    shed_p50_ms = np.percentile([o.latency_ms for o in shed], 50) if shed else None
    under = [o for o in run.outcomes if o.due >= OVER_S]
    bad = [o.due - OVER_S for o in under if o.error is not None or o.latency_ms > DEADLINE_MS]
    recovery_s = max(bad, default=0.0)
    errors = {}
    for o in run.outcomes:
        if o.error not in (None, SHED):
            errors[o.error] = errors.get(o.error, 0) + 1
    print(f"\noverload at {2.5 * CAPACITY:.0f}/s over a capacity of {CAPACITY:.0f}/s: goodput {goodput:.1f}/s "
          f"({goodput / CAPACITY:.2f} of capacity), {len(shed)} of {len(over)} shed (p50 {shed_p50_ms:.1f}, p99 {shed_ms:.1f} ms to the "
          f"refusal), other errors {errors}; fewest healthy members {watch.fewest} over {watch.samples} samples; "
          f"after the load dropped to {0.5 * CAPACITY:.0f}/s, every request answered from {recovery_s:.2f} s on; "
          f"aggregator shed counter {stats.get('shed')}; {partial} answers without every member")

    assert "UnavailableError" not in errors, "a request found no healthy member"
    assert watch.samples >= 20 and watch.fewest >= 1, "every member was ejected"
    assert shed and all(o.retry_after is not None and o.retry_after > 0 for o in shed)
    # most are refused at once; the p99 (printed) also holds those a stall of the shared machine kept in the
    # aggregator's socket past their deadline, refused then by the queue-delay check (198 ms seen once in CI)
    assert shed_p50_ms < DEADLINE_MS / 4, f"shed requests must be refused at once (p50 {shed_p50_ms} ms)"
    assert stats.get("shed", 0) >= len(shed)
    # fixed-capacity members: goodput is set by their timers, not by this machine's CPU; the margin is
    # for a busy 2-core CI runner where this process (driver and members) competes with the aggregator
    assert goodput >= 0.7 * CAPACITY
    assert sum(errors.values()) <= 0.05 * len(run.outcomes)
    assert recovery_s <= 2.0 and len(under) >= 0.9 * 0.5 * CAPACITY * UNDER_S
