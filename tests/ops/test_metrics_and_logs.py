"""The pieces apart from sockets: OpStats histograms, callback families, log formatters; metrics off by default."""

import json
import subprocess
import sys
import logging
import time

import pytest
from prometheus_client import generate_latest

from zmqflow.common.processes import logs, metrics
from zmqflow.common.errors import DEADLINE_EXCEEDED
from zmqflow.common.rpc.client import RpcClient

pytestmark = pytest.mark.unit


def test_op_stats_fill_microsecond_buckets_and_count_codes():
    stats = metrics.OpStats()
    now = time.monotonic()
    stats.observe("enqueue", now, 0, False)  # about a microsecond ago
    stats.observe("dequeue", now - 0.3, DEADLINE_EXCEEDED, True)
    families = {f.name: f for f in stats.families("svc")}
    buckets = {(s.labels["op"], s.labels["le"]): s.value for s in families["zmqflow_rpc_request_duration_seconds"].samples
               if s.name.endswith("_bucket")}
    assert buckets[("enqueue", "1e-05")] == 1 and buckets[("dequeue", "0.25")] == 0 and buckets[("dequeue", "0.5")] == 1
    codes = {(s.labels["op"], s.labels["code"]): s.value for s in families["zmqflow_rpc_requests"].samples
             if s.name.endswith("_total")}
    assert codes == {("enqueue", "OK"): 1, ("dequeue", "DEADLINE_EXCEEDED"): 1}
    waits = [s for s in families["zmqflow_rpc_wait_seconds"].samples if s.name.endswith("_count")]
    assert [(s.labels["op"], s.value) for s in waits] == [("dequeue", 1)]


def test_callbacks_are_read_at_scrape_time_and_a_failing_one_is_skipped():
    box = {"member-a": 1}
    sources = [metrics.counter_callback("zmqflow_test_timeouts", "Timeouts per member.",
                                        lambda: {(m,): n for m, n in box.items()}, ["member"]),
               metrics.gauge_callback("zmqflow_test_broken", "Raises.", lambda: 1 / 0)]
    try:
        box["member-a"] = 5
        text = generate_latest(metrics.REGISTRY).decode()
        assert 'zmqflow_test_timeouts_total{member="member-a"} 5.0' in text
        assert "zmqflow_test_broken" not in text
    finally:
        for source in sources:
            metrics.unregister(source)


def test_every_zmqflow_family_gets_the_task_label_once_and_counters_one_total():
    families = [metrics.counter_family("zmqflow_test_pulls_total", "Named with _total already.", 3),
                metrics.gauge_family("zmqflow_test_own", "Names its task itself.", {("other:1",): 2}, ["task"]),
                metrics.gauge_family("python_test_thing", "Not ours.", 1)]
    before = metrics._task["name"]
    try:
        metrics._task["name"] = "worker:3"
        labelled = [metrics.with_task(f) for f in families]
    finally:
        metrics._task["name"] = before
    samples = {s.name: s.labels for f in labelled for s in f.samples}
    assert samples["zmqflow_test_pulls_total"] == {"task": "worker:3"} and "zmqflow_test_pulls_total_total" not in samples
    assert samples["zmqflow_test_own"] == {"task": "other:1"} and samples["python_test_thing"] == {}


def test_json_formatter_one_line_with_exception_text():
    record = None
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        import sys
        record = logging.LogRecord("ps-shard", logging.ERROR, __file__, 1, "failed: %s", ("x",), sys.exc_info())
    line = logs.JsonFormatter("ps:1").format(record)
    assert "\n" not in line
    event = json.loads(line)
    assert event["task"] == "ps:1" and event["level"] == "ERROR" and event["logger"] == "ps-shard"
    assert event["message"] == "failed: x" and "ValueError: bad" in event["exception"] and event["time"].endswith("Z")


def test_text_formatter_names_the_task_on_every_line():
    record = logging.LogRecord("worker", logging.INFO, __file__, 1, "placement:\n%s", ("a\nb",), None)
    lines = logs.TextFormatter("worker:0").format(record).splitlines()
    assert len(lines) == 3 and "[worker:0]" in lines[0] and all(line.startswith("[worker:0] | ") for line in lines[1:])


@pytest.mark.service
def test_metrics_are_off_unless_asked(broker):
    with RpcClient(broker) as client:
        assert client.call("info", timeout=5.0)[0]["metrics"] is None


@pytest.mark.service
@pytest.mark.parametrize("env", [{"ZMQFLOW_METRICS_BIND": "127.0.0.1:0"}, {"ZMQFLOW_METRICS_PORT": "127.0.0.1:0"}])
def test_metrics_bind_takes_host_and_port_from_the_environment(processes, env):
    """ZMQFLOW_METRICS_BIND, or its old name ZMQFLOW_METRICS_PORT with one warning naming the new one."""
    from tests.ops.helpers import metrics_url, scrape
    proc = processes.service("zmqflow.services.broker", env=env)
    url = metrics_url(proc.endpoint)
    assert url.startswith("http://127.0.0.1:") and "zmqflow_rpc_requests_total" in scrape(url)
    warned = "ZMQFLOW_METRICS_PORT is deprecated: use ZMQFLOW_METRICS_BIND"
    assert proc.log().count(warned) == ("ZMQFLOW_METRICS_PORT" in env), proc.log()[-2000:]


@pytest.mark.service
@pytest.mark.parametrize("flag, bad", [("--metrics-bind", "nope"), ("--metrics-bind", "127.0.0.1:"),
                                       ("--metrics-bind", "70000"), ("--metrics-port", "host:-1")])
def test_a_bad_metrics_bind_is_a_usage_error(flag, bad):
    out = subprocess.run([sys.executable, "-m", "zmqflow.services.broker", flag, bad],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Invalid value for '--metrics-bind'" in out.stderr, out.stderr
    assert "expected [HOST:]PORT" in out.stderr, out.stderr
