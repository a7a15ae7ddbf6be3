"""`zmqflow status` computes a worker's examples/s from zmqflow_worker_examples_total between two scrapes
(workers export the counter, not a rate): '-' on the first, the counter's increase per second after,
a restarted worker counted from zero."""

import http.server
import threading

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from zmqflow.common.processes import metrics
from zmqflow.jobs.status.probe import add_rates, scrape_worker
from zmqflow.jobs.status.render import render

pytestmark = pytest.mark.unit


class WorkerEndpoint:
    """A /metrics endpoint exporting a worker's families as the MetricsHook does, at `examples` now."""

    def __init__(self):
        self.examples, registry = 0, CollectorRegistry()
        registry.register(self)
        text = lambda: generate_latest(registry)  # noqa: E731

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = text()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.address = f"127.0.0.1:{self.httpd.server_port}"

    def collect(self):
        yield metrics.counter_family("zmqflow_worker_examples", "Examples.", self.examples)
        yield metrics.counter_family("zmqflow_worker_steps", "Steps.", self.examples // 100)
        yield metrics.gauge_family("zmqflow_worker_global_step", "Global step.", 7)


@pytest.fixture
def endpoint():
    worker = WorkerEndpoint()
    yield worker
    worker.httpd.shutdown()
    worker.httpd.server_close()


def snapshot_at(time, endpoint):
    return {"time": time, "tasks": [], "workers": [], "worker_metrics": [scrape_worker(0, endpoint.address, 2.0)]}


def test_examples_per_second_from_the_counter_between_two_snapshots(endpoint):
    endpoint.examples = 1000
    first = add_rates(snapshot_at(100.0, endpoint), None)
    row = first["worker_metrics"][0]
    assert row["status"] == "up" and row["examples_total"] == 1000 and row["examples_per_second"] is None
    assert row["steps_total"] == 10 and row["global_step"] == 7     # the row keys status and its views read
    assert "worker:0" in render(first) and " - " in render(first).splitlines()[-1]
    endpoint.examples = 1600
    second = add_rates(snapshot_at(102.0, endpoint), first)
    assert second["worker_metrics"][0]["examples_per_second"] == 300.0
    assert "300" in render(second).splitlines()[-1]
    endpoint.examples = 50                                            # the worker restarted
    third = add_rates(snapshot_at(104.0, endpoint), second)
    assert third["worker_metrics"][0]["examples_per_second"] == 25.0


def test_a_worker_that_is_down_has_no_rate(endpoint):
    endpoint.examples = 500
    first = snapshot_at(0.0, endpoint)
    address = endpoint.address
    endpoint.httpd.shutdown()
    endpoint.httpd.server_close()
    down = {"time": 1.0, "tasks": [], "workers": [], "worker_metrics": [scrape_worker(0, address, 1.0)]}
    row = add_rates(down, first)["worker_metrics"][0]
    assert row["status"] == "down" and row["error"] and row["examples_per_second"] is None
