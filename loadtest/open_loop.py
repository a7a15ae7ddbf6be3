"""An open-loop driver: requests leave on a fixed schedule whether or not earlier ones came back.

A closed loop (send, wait, send) slows down with the server and hides its queueing; here
request i is due at `i / rate` seconds, and its latency counts from that due time, so a
stalled server shows up as latency rather than as fewer requests (no coordinated omission).
Between sends the driver collects replies with `poll(timeout)`. `run_phases` changes the rate
on schedule (e.g. over capacity, then back under it) without a pause between phases.

Requests a service shed (ResourceExhaustedError: answered at once, with a retry hint) are
counted apart from failures: shedding is the overloaded service's way of staying up.
"""

import time
from dataclasses import dataclass, field

import numpy as np


SHED = "ResourceExhaustedError"


@dataclass
class Outcome:
    due: float  # seconds since the start
    latency_ms: float | None = None  # answers and errors alike: a shed request shows how fast it was refused
    error: str | None = None
    info: dict | None = None
    retry_after: float | None = None  # seconds a shedding service asked the client to wait


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
        shed = errors.pop(SHED, 0)
        failed = len(chosen) - len(ok) - shed

        def pct(q):
            return round(float(np.percentile(ok, q)), 3) if len(ok) else None
        return {"requests": len(chosen), "answered": len(ok), "failed": failed,
                "failed_share": round(failed / len(chosen), 5) if chosen else 0.0,
                "shed": shed, "shed_share": round(shed / len(chosen), 5) if chosen else 0.0,
                "qps": round(len(ok) / (end - start), 1) if end > start else 0.0,
                "p50_ms": pct(50), "p99_ms": pct(99), "p999_ms": pct(99.9),
                "max_ms": round(float(ok.max()), 3) if len(ok) else None, "errors": errors}


def run_open_loop(submit, poll, rate, duration, drain_s=5.0, on_tick=None):
    """Send `submit()` at `rate` per second for `duration` s; `submit()` returns a pending call
    with `.done` and `.result()`, `poll(timeout)` takes in replies. `on_tick(elapsed, run)` is
    called between sends (to kill or pause a member on time). Waits up to `drain_s` at the end."""
    return _drive(submit, poll, Run(rate, duration), [i / rate for i in range(int(rate * duration))], drain_s, on_tick)


def run_phases(submit, poll, phases, drain_s=5.0, on_tick=None):
    """Like `run_open_loop` over consecutive `phases` [(rate, seconds), ...]: the schedule moves from one
    rate to the next at once. The Run's `rate` is the first phase's; `summary(start, end)` reads any span."""
    dues, start = [], 0.0
    for rate, seconds in phases:
        dues.extend(start + i / rate for i in range(int(rate * seconds)))
        start += seconds
    return _drive(submit, poll, Run(phases[0][0], start), dues, drain_s, on_tick)


def _drive(submit, poll, run, dues, drain_s, on_tick):
    in_flight = []
    start = time.perf_counter()
    total, duration = len(dues), run.duration
    for i in range(total + 1):
        due = dues[i] if i < total else duration
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
        outcome.latency_ms = (now - start - outcome.due) * 1000.0
        try:
            _, info = pending.result()
            outcome.info = info
        except Exception as exc:
            outcome.error = type(exc).__name__
            outcome.retry_after = getattr(exc, "retry_after", None)
    return still
