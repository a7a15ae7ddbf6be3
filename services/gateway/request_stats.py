"""The gateway's infer requests for Prometheus (--metrics-port): counts per model and HTTP status, latency per model.

Kept in plain dicts on the event loop's thread (no lock on the request path) and turned into metric
families only when /metrics is scraped, from the metrics endpoint's own thread: a scrape may read a
count one request old, never a torn one (dict reads of ints and lists are atomic under the GIL).
"""

import bisect

from zmqflow.common.processes import metrics


class RequestStats:
    """`observe(model, status, seconds)` per infer request; `families()` at scrape time."""

    def __init__(self):
        self.codes = {}       # (model, status) -> requests
        self.duration = {}    # model -> [sum of seconds, counts per LATENCY_BUCKETS bucket and above]

    def observe(self, model, status, seconds):
        key = (model, str(status))
        self.codes[key] = self.codes.get(key, 0) + 1
        h = self.duration.get(model)
        if h is None:
            h = self.duration[model] = [0.0, [0] * (len(metrics.LATENCY_BUCKETS) + 1)]
        h[0] += seconds
        h[1][bisect.bisect_left(metrics.LATENCY_BUCKETS, seconds)] += 1

    def families(self):
        yield metrics.counter_family("zmqflow_gateway_infer_requests", "Infer requests answered, per model and "
                                     "HTTP status.", dict(self.codes), ("model", "status"))
        yield metrics.histogram_family("zmqflow_gateway_infer_duration_seconds", "Time from an infer request's "
                                       "routing to its answer, body read and upstream call included.", ("model",),
                                       {(model, ): (h[0], list(h[1])) for model, h in list(self.duration.items())})

    def export(self):
        """Serve these families at every scrape of this process's metrics endpoint."""
        metrics.register(self.families)
        return self
