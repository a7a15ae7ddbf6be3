"""Prometheus metrics for every task, read at scrape time so the hot paths pay almost nothing.

Counters a task already keeps (stats dicts, queue sizes, the trainer's step count) are
exported by callbacks that run when Prometheus scrapes (`gauge_callback`,
`counter_callback`, `register`). Request latencies per op go into `OpStats`: plain
lists (one bisect and three adds per request) turned into histograms at scrape time.
Metrics are off unless a task is started with `--metrics-bind [HOST:]PORT` (port 0: any free port);
the endpoint is HTTP on 127.0.0.1 unless HOST says otherwise.

Names follow Prometheus' conventions (docs/metrics.md): running totals are counters
(exported as `NAME_total`), durations histograms in seconds, sizes in `_bytes`; no rate is
computed here, since PromQL's rate() does it from the counters over any window. Every
zmqflow_* family gets the process's `task` label (`set_task`) in one place, the collector,
so one query can sum or split any metric by task.

    from zmqflow.common.processes import metrics
    metrics.counter_callback("zmqflow_aggregator_member_timeouts", "Requests to a member that timed out.",
                             lambda: {(m,): s["timeouts"] for m, s in members.stats().items()}, ["member"])
"""

import bisect
import logging
import threading
import time

from zmqflow.common import errors
from zmqflow.common.bind import BindError

log = logging.getLogger(__name__)

LATENCY_BUCKETS = tuple(m * 10.0 ** e for e in range(-5, 1) for m in (1.0, 2.5, 5.0)) + (10.0,)
"""10 us .. 10 s, three per decade: fine enough for the broker's microsecond ops."""

_CODE_NAMES = {getattr(errors, n): n for n in dir(errors) if n.isupper() and isinstance(getattr(errors, n), int)}
_requested = {"port": None, "host": "127.0.0.1", "port_host": None}  # port_host: HOST of --metrics-bind HOST:PORT
_lock = threading.Lock()
_server = {}
_task = {"name": None}


# ------------------------------------------------------------ families built at scrape time

def _family(kind, name, doc, labels, values):
    """A metric family from a number or a {label values: number} dict."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
    family = cls(name, doc, labels=list(labels))
    if not isinstance(values, dict):
        values = {(): values}
    for key, value in values.items():
        if value is not None:
            family.add_metric([str(k) for k in (key if isinstance(key, tuple) else (key,))], float(value))
    return family


def histogram_family(name, doc, labels, histograms, bounds=LATENCY_BUCKETS):
    """{label values: (sum, [count per bucket..., count above the last])} as a Prometheus histogram."""
    from prometheus_client.core import HistogramMetricFamily
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for key, (total, counts) in histograms.items():
        running, buckets = 0, []
        for bound, count in zip(bounds, counts):
            running += count
            buckets.append((_bound(bound), running))
        buckets.append(("+Inf", running + counts[len(bounds)]))
        family.add_metric([str(k) for k in key], buckets, total)
    return family


def _bound(bound):
    return f"{bound:.6g}"


def set_task(task, service):
    """The task this process runs ("worker:1", "ps:0"): the `task` label of every zmqflow_* family,
    and zmqflow_task_info{task, service} = 1, so dashboards can list every task, RPC service or not."""
    _task["name"] = task
    gauge("zmqflow_task_info", "1 for the task this process runs.", ("task", "service")).labels(task, service).set(1)


def with_task(family):
    """`family` with the process's `task` label on every sample, unless it names a task itself."""
    task = _task["name"]
    if task is None or not family.name.startswith("zmqflow_") or any("task" in s.labels for s in family.samples):
        return family
    family.samples = [s._replace(labels={**s.labels, "task": task}) for s in family.samples]
    return family


class _Callbacks:
    """The collector behind every callback: a failing callback loses its own metrics, not the scrape."""

    def __init__(self):
        self.sources = []

    def collect(self):
        for source in list(self.sources):
            for attempt in range(3):  # a dict another thread resized under us: read it again
                try:
                    families = list(source())
                    break
                except RuntimeError:
                    families = []
                except Exception:  # noqa: BLE001 - a scrape must never fail for one source
                    log.exception("metrics source %r failed", source)
                    families = []
                    break
            yield from (with_task(family) for family in families)


_CALLBACKS = _Callbacks()
_registry = []


def registry():
    """The process's CollectorRegistry (also `metrics.REGISTRY`), made on first use: a task without --metrics-bind
    never imports prometheus_client, ~0.1 s of every service's start-up (bench startup)."""
    with _lock:
        if not _registry:
            from prometheus_client import CollectorRegistry
            _registry.append(CollectorRegistry(auto_describe=True))
            _registry[0].register(_CALLBACKS)
        return _registry[0]


def __getattr__(name):
    if name == "REGISTRY":
        return registry()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register(source):
    """Export what `source()` yields (metric families) at every scrape; returns a handle for `unregister`."""
    _CALLBACKS.sources.append(source)
    return source


def unregister(source):
    if source in _CALLBACKS.sources:
        _CALLBACKS.sources.remove(source)


def gauge_callback(name, doc, fn, labels=()):
    """A gauge read from `fn()` (a number, or {label values: number}) at each scrape."""
    return register(lambda: [_family("gauge", name, doc, labels, fn())])


def counter_callback(name, doc, fn, labels=()):
    """A counter read from `fn()` at each scrape (a stats dict's running totals); its samples are
    NAME_total (a NAME given with `_total` already keeps one)."""
    return register(lambda: [_family("counter", name, doc, labels, fn())])


def gauge_family(name, doc, values, labels=()):
    return _family("gauge", name, doc, labels, values)


def counter_family(name, doc, values, labels=()):
    return _family("counter", name, doc, labels, values)


_made = {}


def gauge(name, doc, labels=()):
    """A plain prometheus_client Gauge (get or create) for values set as they change."""
    from prometheus_client import Gauge
    metrics_registry = registry()
    with _lock:
        if name not in _made:
            _made[name] = Gauge(name, doc, list(labels), registry=metrics_registry)
        return _made[name]


# ------------------------------------------------------------ requests per op

class OpStats:
    """Requests per op: counts per status code and latency histograms, kept in plain lists.

    `duration`: received to answered (parked time included); `wait`: the same for
    requests that were parked (a blocked dequeue's wait)."""

    __slots__ = ("duration", "wait", "codes")

    def __init__(self):
        self.duration, self.wait, self.codes = {}, {}, {}

    def observe(self, op, received, code, parked):
        elapsed = time.monotonic() - received
        h = self.duration.get(op)
        if h is None:
            h = self.duration[op] = [0.0, [0] * (len(LATENCY_BUCKETS) + 1)]
        h[0] += elapsed
        h[1][bisect.bisect_left(LATENCY_BUCKETS, elapsed)] += 1
        if parked:
            w = self.wait.get(op)
            if w is None:
                w = self.wait[op] = [0.0, [0] * (len(LATENCY_BUCKETS) + 1)]
            w[0] += elapsed
            w[1][bisect.bisect_left(LATENCY_BUCKETS, elapsed)] += 1
        key = (op, code)
        self.codes[key] = self.codes.get(key, 0) + 1

    def families(self, service):
        def by_op(table):
            return {(service, op): (h[0], list(h[1])) for op, h in list(table.items())}
        yield counter_family("zmqflow_rpc_requests", "Requests answered, per op and status code.",
                             {(service, op, _CODE_NAMES.get(code, str(code))): n
                              for (op, code), n in list(self.codes.items())}, ("service", "op", "code"))
        yield histogram_family("zmqflow_rpc_request_duration_seconds",
                               "Time from a request's arrival to its answer, parked time included.",
                               ("service", "op"), by_op(self.duration))
        yield histogram_family("zmqflow_rpc_wait_seconds", "Time parked requests waited (blocked dequeues, "
                               "sync pulls) until answered.", ("service", "op"), by_op(self.wait))


def export_service(service, task):
    """Time every request of an rpc Service per op and export its `metric_families()` at scrape time."""
    service.op_stats = OpStats()
    own = getattr(service, "metric_families", None)

    def source():
        yield from service.op_stats.families(service.name)
        yield gauge_family("zmqflow_rpc_parked_requests", "Requests parked (waiting) in the service now.",
                           {(service.name,): len(service.parked)}, ("service",))
        yield gauge_family("zmqflow_rpc_connections", "Connections to the service now (--max-connections).",
                           {(service.name,): len(service.connections)}, ("service",))
        yield counter_family("zmqflow_rpc_peers_refused", "Peers dropped or requests refused at a bound "
                             "(docs/security.md), by which.",
                             {(service.name, why): n for why, n in service.connections.refused.items()},
                             ("service", "reason"))
        if own is not None:
            yield from own()
    set_task(task, service.name)
    register(source)


# ------------------------------------------------------------ the HTTP endpoint

def request(port=None, host=None, port_host=None):
    """Remember what the command line asked for (the --metrics-* callbacks); the HOST of
    --metrics-bind HOST:PORT wins over the deprecated --metrics-host."""
    if port is not None:
        _requested["port"] = port
    if host is not None:
        _requested["host"] = host
    if port_host is not None:
        _requested["port_host"] = port_host


def requested():
    return _requested["port"] is not None


def serve(port=None, host=None):
    """Start the /metrics HTTP endpoint (once per process); returns its URL (BindError: it cannot listen there)."""
    from prometheus_client import start_http_server
    from prometheus_client.gc_collector import GCCollector
    from prometheus_client.platform_collector import PlatformCollector
    from prometheus_client.process_collector import ProcessCollector
    metrics_registry = registry()
    with _lock:
        if "url" not in _server:
            port = _requested["port"] if port is None else port
            host = host or _requested["port_host"] or _requested["host"]
            ProcessCollector(registry=metrics_registry)
            PlatformCollector(registry=metrics_registry)
            GCCollector(registry=metrics_registry)
            try:
                httpd, _ = start_http_server(port, addr=host, registry=metrics_registry)
            except OSError as exc:   # in use, no such interface: the task's --metrics-bind
                raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
            shown = f"[{host}]" if ":" in host else host
            _server.update(httpd=httpd, url=f"http://{shown}:{httpd.server_port}/metrics")
            log.info("metrics on %s", _server["url"])
        return _server["url"]


def serve_requested():
    """Start the endpoint if --metrics-bind was given; its URL, else None."""
    return serve() if requested() else None
