"""The gateway's infer requests for Prometheus (--metrics-bind): counts per model and status, latency per model,
for HTTP (status: the HTTP status) and for gRPC (code: the gRPC status code's name) apart.

Kept in plain dicts on the event loop's thread (no lock on the request path) and turned into metric
families only when /metrics is scraped, from the metrics endpoint's own thread: a scrape may read a
count one request old, never a torn one (dict reads of ints and lists are atomic under the GIL).
"""

import bisect

from zmqflow.common.processes import metrics


class _Requests:
    """Counts per (model, status) and a latency histogram per model, of one protocol's infer requests."""

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

    def families(self, prefix, status_label, counted, timed):
        yield metrics.counter_family(f"{prefix}_requests", counted, dict(self.codes), ("model", status_label))
        yield metrics.histogram_family(f"{prefix}_duration_seconds", timed, ("model",),
                                       {(model, ): (h[0], list(h[1])) for model, h in list(self.duration.items())})


class RequestStats:
    """`observe(model, status, seconds)` per HTTP infer request, `observe_grpc(model, code, seconds)` per gRPC
    ModelInfer; `families()` at scrape time."""

    def __init__(self):
        self.http, self.grpc = _Requests(), _Requests()

    def observe(self, model, status, seconds):
        self.http.observe(model, status, seconds)

    def observe_grpc(self, model, code, seconds):
        self.grpc.observe(model, code, seconds)

    def families(self):
        yield from self.http.families("zmqflow_gateway_infer", "status", "Infer requests answered, per model and "
                                      "HTTP status.", "Time from an infer request's routing to its answer, body "
                                      "read and upstream call included.")
        if self.grpc.codes:
            yield from self.grpc.families("zmqflow_gateway_grpc_infer", "code", "gRPC ModelInfer requests answered, "
                                          "per model and gRPC status code.", "Time from a gRPC ModelInfer's start "
                                          "to its answer, upstream call included.")

    def export(self):
        """Serve these families at every scrape of this process's metrics endpoint."""
        metrics.register(self.families)
        return self
