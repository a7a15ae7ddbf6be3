"""Aggregator counters and latency percentiles over a window of recent requests.

A fixed ring of the last `window` latencies keeps memory flat and `stats` cheap; the
counters are a plain dict so a metrics exporter can read them as they are.
"""

import numpy as np

COUNTERS = ("requests", "answered", "failed", "partial", "late_dropped", "probes", "shed")


class AggregatorStats:
    def __init__(self, window=100_000):
        self.counters = dict.fromkeys(COUNTERS, 0)
        # written through now: np.zeros's pages are mapped as they are first written, so its 800 KB grew the RSS
        # by 8 bytes a request over the first 100,000 (issue 27); the ring's memory shows from the start instead
        self._latencies = np.full(window, np.nan)
        self._count = 0

    def record(self, latency_s, ok, partial=False):
        """One client request finished after `latency_s`: answered (`ok`) or failed; `partial` = some member missing."""
        self.counters["answered" if ok else "failed"] += 1
        if partial:
            self.counters["partial"] += 1
        self._latencies[self._count % len(self._latencies)] = latency_s
        self._count += 1

    def latency_ms(self):
        """p50/p99/p999/max in ms over the window (None when nothing finished yet)."""
        n = min(self._count, len(self._latencies))
        if not n:
            return {"p50": None, "p99": None, "p999": None, "max": None, "count": 0}
        p50, p99, p999 = np.percentile(self._latencies[:n], [50, 99, 99.9]) * 1000.0
        return {"p50": round(p50, 3), "p99": round(p99, 3), "p999": round(p999, 3),
                "max": round(float(self._latencies[:n].max()) * 1000.0, 3), "count": self._count}
