"""`zmqflow status --web` as a real process over a real broker, ps shard and aggregator: the page and uPlot served from
the package, /api/snapshot's tables (a queue's depth following enqueues, the chief's validation read from a
real Prometheus endpoint), /api/history growing within its bound; --web without the http extra."""

import json
import os
import re
import sys
import urllib.request

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.cli.status import command as status_command
from zmqflow.common.processes import metrics as prometheus
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.jobs.status.web import STATIC_DIR
from zmqflow.models.spec import MNIST_MLP
from zmqflow.services.worker.validation import ValidationHook
from tests.support import free_port, wait_for

HISTORY = 5
MEMBER = f"tcp://127.0.0.1:{free_port()}"      # nothing serves there


@pytest.fixture(scope="module")
def chief_validation():
    """The validation gauges as a chief exports them (ValidationHook.families), on this process's /metrics."""
    hook = object.__new__(ValidationHook)          # only its exporter: no data spec, no thread
    hook.history = [{"step": 40, "accuracy": 0.875, "loss": 0.31}]
    source = prometheus.register(hook.families)
    yield prometheus.serve(port=0, host="127.0.0.1")
    prometheus.unregister(source)


@pytest.fixture(scope="module")
def web(module_processes, chief_validation, tmp_path_factory):
    """A broker with a 7-deep queue, a ps shard, and `status --web` over them (any free port)."""
    broker = module_processes.service("zmqflow.services.broker")
    ps = module_processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    aggregator = module_processes.service("zmqflow.services.aggregator", ["--member", MEMBER])
    queue = FIFOQueue(50, ["float32"], shapes=[[2]], shared_name="train", broker=broker.endpoint)
    queue.enqueue_many([np.zeros((7, 2), np.float32)])
    log = tmp_path_factory.mktemp("status") / "status-web.log"
    view = module_processes.start("status-web", [
        sys.executable, "-m", "zmqflow", "status", "--web", "--web-bind", "127.0.0.1:0",
        "--interval-secs", "0.2", "--timeout-secs", "1", "--history", str(HISTORY), "--broker", broker.endpoint,
        "--ps", ps.endpoint, "--aggregator", aggregator.endpoint, "--worker-metrics", chief_validation],
        log_path=str(log))
    url = wait_for(lambda: re.search(r"web view on (http://\S+)", view.log()), 20, "the web view's URL").group(1)
    assert url.startswith("http://127.0.0.1:")
    return url, queue, view


def get(url, path):
    with urllib.request.urlopen(url.rstrip("/") + path, timeout=5) as answer:
        return answer.status, answer.headers.get("content-type"), answer.read()


@pytest.mark.service
def test_the_page_and_its_chart_library_come_from_the_package(web):
    url, _, _ = web
    status, kind, page = get(url, "/")
    assert status == 200 and kind.startswith("text/html")
    assert b'src="/static/uPlot.iife.min.js"' in page and b'src="/static/app.js"' in page
    for name in ("index.html", "app.js", "style.css"):      # nothing fetched from elsewhere: works offline
        with open(os.path.join(STATIC_DIR, name), "rb") as f:
            assert not re.search(rb"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", f.read()), name
    status, kind, library = get(url, "/static/uPlot.iife.min.js")
    with open(os.path.join(STATIC_DIR, "uPlot.iife.min.js"), "rb") as f:
        assert status == 200 and "javascript" in kind and library == f.read()
    assert get(url, "/static/uPlot.min.css")[0] == 200


@pytest.mark.service
def test_snapshot_shows_tasks_queue_depth_shards_and_the_chiefs_validation(web, chief_validation):
    url, queue, _ = web

    def snapshot():
        return json.loads(get(url, "/api/snapshot")[2])["snapshot"]

    snap = wait_for(snapshot, 10, "a first snapshot")
    assert {(t["task"], t["status"], t["service"]) for t in snap["tasks"]} == {
        ("broker:0", "up", "queue-broker"), ("ps:0", "up", "ps-shard"), ("aggregator:0", "up", "aggregator")}
    [aggregator] = snap["aggregators"]       # its stats: counters and latency percentiles (none answered yet)
    assert aggregator["members"] == 1 and aggregator["requests"] == 0 and aggregator["latency_p50_ms"] is None
    assert aggregator["mode"] and aggregator["rtt_ms"] > 0
    assert [(m["member"], m["answers"], m["timeouts"]) for m in snap["members"]] == [(MEMBER, 0, 0)]
    assert snap["shards"][0]["shard"] == "ps:0" and snap["shards"][0]["step"] == 0
    assert snap["workers"][0]["worker"] == "worker:0" and snap["workers"][0]["metrics"] == "up"
    assert snap["validation"] == {"metrics": {"accuracy": 0.875, "loss": 0.31}, "global_step": 40}
    assert {(q["queue"], q["size"], q["capacity"]) for q in snap["queues"]} == {("train", 7, 50)}
    queue.enqueue_many([np.zeros((3, 2), np.float32)])
    wait_for(lambda: snapshot()["queues"][0]["size"] == 10, 10, "the queue's depth after 3 more")


@pytest.mark.service
def test_history_grows_up_to_its_bound(web):
    url, _, view = web

    def history():
        return json.loads(get(url, "/api/history")[2])

    first = len(wait_for(lambda: history()["training"]["time"], 10, "a first point"))
    full = wait_for(lambda: len(history()["training"]["time"]) == HISTORY and history(), 10, "a full history")
    assert first <= HISTORY and full["interval_s"] == 0.2
    times = full["training"]["time"]
    assert times == sorted(times) and full["training"]["global_step"] == [0] * HISTORY
    assert full["validation"] == {"global_step": [40], "accuracy": [0.875], "loss": [0.31]}   # once, not per poll
    later = wait_for(lambda: history()["training"]["time"][0] > times[0] and history(), 10, "the ring moving on")
    print(f"history: {len(later['training']['time'])} points kept of a ring of {HISTORY}")
    assert len(later["training"]["time"]) == HISTORY and view.alive()


@pytest.mark.unit
def test_web_needs_the_http_extra_and_no_once(monkeypatch):
    runner = CliRunner()
    clash = runner.invoke(status_command, ["--web", "--once", "--ps", "127.0.0.1:1"])
    assert clash.exit_code == 2 and "--web serves a page" in clash.output
    bad = runner.invoke(status_command, ["--web", "--web-bind", "127.0.0.1:http", "--ps", "127.0.0.1:1"])
    assert bad.exit_code == 2 and "expected [HOST:]PORT" in bad.output
    monkeypatch.setitem(sys.modules, "starlette", None)          # as when zmqflow[http] is not installed
    missing = runner.invoke(status_command, ["--web", "--ps", "127.0.0.1:1"])
    assert missing.exit_code == 2 and "pip install 'zmqflow[http]'" in missing.output, missing.output
