"""An open-loop driver: requests leave on a fixed schedule whether or not earlier ones came back.

A closed loop (send, wait, send) slows down with the server and hides its queueing; here
request i is due at `i / rate` seconds, and its latency counts from that due time, so a
stalled server shows up as latency rather than as fewer requests (no coordinated omission).
Between sends the driver collects replies with `poll(timeout)`.
"""

import time
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Outcome:
    due: float  # seconds since the start
    latency_ms: float | None = None
    error: str | None = None
    info: dict | None = None


@dataclass
class Run:
    rate: float
    duration: float
    outcomes: list = field(default_factory=list)
    events: list = field(default_factory=list)  # (seconds since the start, what happened)

    def summary(self, start=0.0, end=None):
        """Counts and latency percentiles of the requests due in [start, end)."""
        end = self.duration if end is None else end
        chosen = [o for o in self.outcomes if start <= o.due < end]
        ok = np.array([o.latency_ms for o in chosen if o.error is None], dtype=np.float64)
        errors = {}
        for o in chosen:
            if o.error is not None:
                errors[o.error] = errors.get(o.error, 0) + 1
        failed = len(chosen) - len(ok)

        def pct(q):
            return round(float(np.percentile(ok, q)), 3) if len(ok) else None
        return {"requests": len(chosen), "answered": len(ok), "failed": failed,
                "failed_share": round(failed / len(chosen), 5) if chosen else 0.0,
                "qps": round(len(ok) / (end - start), 1) if end > start else 0.0,
                "p50_ms": pct(50), "p99_ms": pct(99), "p999_ms": pct(99.9),
                "max_ms": round(float(ok.max()), 3) if len(ok) else None, "errors": errors}


def run_open_loop(submit, poll, rate, duration, drain_s=5.0, on_tick=None):
    """Send `submit()` at `rate` per second for `duration` s; `submit()` returns a pending call
    with `.done` and `.result()`, `poll(timeout)` takes in replies. `on_tick(elapsed, run)` is
    called between sends (to kill or pause a member on time). Waits up to `drain_s` at the end."""
    run = Run(rate, duration)
    in_flight = []
    start = time.perf_counter()
    total = int(rate * duration)
    for i in range(total + 1):
        due = i / rate if i < total else duration
        while True:  # collect until this request is due
            now = time.perf_counter() - start
            in_flight = _collect(in_flight, now + start, start)
            if on_tick is not None:
                on_tick(now, run)
            if now >= due:
                break
            poll(min(due - now, 0.005))
        if i == total:
            break
        outcome = Outcome(due)
        run.outcomes.append(outcome)
        try:
            in_flight.append((outcome, submit()))
        except Exception as exc:  # refused before it left: a failure of this request, not of the test
            outcome.error = type(exc).__name__
    give_up = time.perf_counter() + drain_s
    while in_flight and time.perf_counter() < give_up:
        poll(0.005)
        in_flight = _collect(in_flight, time.perf_counter(), start)
    for outcome, _ in in_flight:
        outcome.error = "NoAnswer"
    return run


def _collect(in_flight, now, start):
    still = []
    for outcome, pending in in_flight:
        if not pending.done:
            still.append((outcome, pending))
            continue
        try:
            _, info = pending.result()
            outcome.latency_ms = (now - start - outcome.due) * 1000.0
            outcome.info = info
        except Exception as exc:
            outcome.error = type(exc).__name__
    return still
