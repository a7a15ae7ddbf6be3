"""The soak tier's instruments (tests/soak/): a service process's resident memory, open descriptors and threads,
sampled from /proc while the service is driven at full rate, and the check that none of them grew past a bound once
the service had warmed up.

How long each service is driven comes from ZMQFLOW_SOAK_SECS (ZMQFLOW_SOAK_SECONDS before, still read with a
warning): unset, the short form that `make test` runs (a few seconds a service); `make test-soak` sets minutes. The first third of a run is the warm-up (imports, JIT, the
allocator's and libzmq's buffers, a latency ring being filled); from the first sample after it, a service may grow
by at most `Bounds.rss_mb` of RSS (16 MB: a leak of a few hundred bytes a request passes a short run, so the long
form is the one that tells), and not at all in descriptors or threads beyond a slack of 2 (a connection or a
helper thread that comes and goes).
"""

import os
import threading
import time
from dataclasses import dataclass

from zmqflow.common.errors import ResourceExhaustedError
from zmqflow.common.renames import read_environment

SECONDS_ENV = "ZMQFLOW_SOAK_SECS"
OLD_SECONDS_ENV = "ZMQFLOW_SOAK_SECONDS"
SHORT_SECONDS = 4.0
MB = 2 ** 20


def soak_seconds():
    """Seconds to drive each service: ZMQFLOW_SOAK_SECS, or the short form's."""
    text = (read_environment(SECONDS_ENV, old=OLD_SECONDS_ENV) or "").strip()
    if not text:
        return SHORT_SECONDS
    seconds = float(text)
    if not seconds > 0:
        raise ValueError(f"{SECONDS_ENV} must be a number of seconds > 0, got {text!r}")
    return seconds


def soak_timeout():
    """The pytest timeout of one soak test: its soak and the start-up and shut-down of what it drives."""
    return int(120 + 3 * soak_seconds())


@dataclass(frozen=True)
class Sample:
    at: float      # seconds since sampling began
    rss: int       # bytes resident (VmRSS)
    fds: int       # open file descriptors
    threads: int


def read_sample(pid, at=0.0):
    """One Sample of process `pid` from /proc; ProcessLookupError when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(line.split(":", 1) for line in f if ":" in line)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        raise ProcessLookupError(f"process {pid} is gone") from None
    if "VmRSS" not in status:   # a zombie: it exited, nobody reaped it yet
        raise ProcessLookupError(f"process {pid} has exited")
    return Sample(at, int(status["VmRSS"].split()[0]) * 1024, fds, int(status["Threads"]))


class Sampler:
    """Samples the processes {name: pid} every `interval` seconds in a thread, while in its `with` block.

    `samples[name]` lists what was read; `gone[name]` says when (seconds) a process stopped answering, if it did.
    """

    def __init__(self, pids, interval=0.5):
        self.pids, self.interval = dict(pids), interval
        self.samples = {name: [] for name in self.pids}
        self.gone = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._start = None

    def __enter__(self):
        self._start = time.monotonic()
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self._take()

    def _run(self):
        while not self._stop.wait(self.interval):
            self._take()

    def _take(self):
        at = time.monotonic() - self._start
        for name, pid in self.pids.items():
            if name in self.gone:
                continue
            try:
                self.samples[name].append(read_sample(pid, at))
            except ProcessLookupError:
                self.gone[name] = at


@dataclass(frozen=True)
class Bounds:
    rss_mb: float = 16.0       # growth of RSS after the warm-up, MB
    fds: int = 2               # growth of open descriptors after the warm-up
    threads: int = 2           # growth of threads after the warm-up
    warm_share: float = 1 / 3  # the first share of the run that is warm-up


def check(name, sampler, driven, unit, seconds, bounds=Bounds()):
    """Print the figures of service `name`'s soak (`driven` `unit`s in `seconds`) and fail, naming what grew, when
    its RSS, descriptors or threads grew past `bounds` after the warm-up, or when it died."""
    samples = sampler.samples[name]
    assert name not in sampler.gone, f"{name} died {sampler.gone[name]:.1f} s into its soak"
    warm_at = samples[-1].at * bounds.warm_share
    after = [s for s in samples if s.at >= warm_at]
    assert len(after) >= 3, f"{name}: only {len(after)} samples after the warm-up (sampling too slow?)"
    base, last = after[0], after[-1]
    top = max(after, key=lambda s: s.rss)
    rss_growth = top.rss - base.rss
    fds_growth = max(s.fds for s in after) - base.fds
    threads_growth = max(s.threads for s in after) - base.threads
    span = last.at - base.at
    slope = (last.rss - base.rss) / span if span > 0 else 0.0
    print(f"\nsoak {name}: {seconds:.0f} s, {driven} {unit} ({driven / seconds:.0f}/s); "
          f"RSS {samples[0].rss / MB:.1f} MB at start, {base.rss / MB:.1f} MB after the warm-up ({base.at:.1f} s), "
          f"{min(s.rss for s in after) / MB:.1f}-{top.rss / MB:.1f} MB after it (+{rss_growth / MB:.2f} MB, "
          f"end {last.rss / MB:.1f} MB, {slope / 1024:+.1f} KB/s); fds {base.fds} -> max {base.fds + fds_growth}; "
          f"threads {base.threads} -> max {base.threads + threads_growth}; {len(samples)} samples")
    problems = []
    if rss_growth > bounds.rss_mb * MB:
        problems.append(f"RSS grew {rss_growth / MB:.1f} MB after the warm-up ({base.rss / MB:.1f} MB at "
                        f"{base.at:.1f} s -> {top.rss / MB:.1f} MB at {top.at:.1f} s; bound {bounds.rss_mb:.0f} MB)")
    if fds_growth > bounds.fds:
        problems.append(f"open descriptors grew by {fds_growth} after the warm-up (from {base.fds}; bound "
                        f"{bounds.fds})")
    if threads_growth > bounds.threads:
        problems.append(f"threads grew by {threads_growth} after the warm-up (from {base.threads}; bound "
                        f"{bounds.threads})")
    assert not problems, f"{name} ({driven} {unit} in {seconds:.0f} s): " + "; ".join(problems)


def drive(submit, poll, seconds, window=16, drain_s=60.0):
    """Keep `window` requests in flight for `seconds` (closed loop: as fast as the service answers), then collect
    the last (for at most `drain_s`). `submit()` returns a pending request with `done` and `result()`;
    `poll(timeout)` takes answers in. A request the service sheds (ResourceExhaustedError with `retry_after_ms`:
    an aggregator whose members would answer too late, as on a machine busy with other tests) is not an error:
    the driver waits as long as it asks before the next submit, as a client should. Returns (answered, [errors])."""
    in_flight, answered, errors = [], 0, []
    end = time.monotonic() + seconds
    resume = 0.0   # no submits before this (a shed's retry_after_ms)
    while True:
        now = time.monotonic()
        while now < end and now >= resume and len(in_flight) < window:
            in_flight.append(submit())
        if not in_flight and now >= min(end, resume):
            return answered, errors
        assert now < end + drain_s, f"{len(in_flight)} requests unanswered {drain_s:g} s after the soak"
        poll(0.05)
        still = []
        for pending in in_flight:
            if not pending.done:
                still.append(pending)
                continue
            try:
                pending.result()
                answered += 1
            except ResourceExhaustedError as exc:
                retry_after_ms = exc.details.get("retry_after_ms")
                if retry_after_ms is None:
                    errors.append(exc)
                else:
                    resume = max(resume, time.monotonic() + retry_after_ms / 1000)
            except Exception as exc:  # counted and named by the caller's assertion
                errors.append(exc)
        in_flight = still
