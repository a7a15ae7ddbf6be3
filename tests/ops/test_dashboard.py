"""deploy/grafana/zmqflow-dashboard.json: every panel on the ${DS_PROMETHEUS} data source, and every query
reads only documented metrics (docs/metrics.md, itself held to what the tasks export by
test_metric_conventions.py), rates only of counters and histogram buckets, gauges as they are."""

import json
import re

import pytest

from tests.ops.metric_names import DASHBOARD, documented_metrics, family_name, queried_metrics

pytestmark = pytest.mark.unit

DATASOURCE = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}


def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def queries(dashboard):
    """(panel title, PromQL) of every target, and of the template variables."""
    found = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]
    found += [(f"${v['name']}", v["query"]["query"]) for v in dashboard["templating"]["list"] if v["type"] == "query"]
    return found


def test_every_panel_reads_the_chosen_prometheus():
    dashboard = load_dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource" and variables["DS_PROMETHEUS"]["query"] == "prometheus"
    assert variables["task"]["datasource"] == DATASOURCE
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)) >= 10
    for panel in dashboard["panels"]:
        assert panel["datasource"] == DATASOURCE and panel["targets"], panel["title"]
        assert all(t["datasource"] == DATASOURCE for t in panel["targets"]), panel["title"]


def test_queries_read_documented_metrics_by_their_kind():
    documented = documented_metrics()
    problems = []
    for title, expr in queries(load_dashboard()):
        names = queried_metrics(expr)
        if not names:
            problems.append(f"{title}: no zmqflow metric in {expr}")
        for name in names:
            if family_name(name) not in documented:
                problems.append(f"{title}: {name} is not in docs/metrics.md")
            elif documented[family_name(name)] == "counter" and not name.endswith("_total"):
                problems.append(f"{title}: counter {name} without _total")
            elif documented[family_name(name)] == "histogram" and name == family_name(name):
                problems.append(f"{title}: histogram {name} without _bucket, _sum or _count")
        for name in re.findall(r"\b(?:rate|increase|irate)\((\w+)", expr):
            if not name.endswith(("_total", "_bucket", "_sum", "_count")):
                problems.append(f"{title}: rate() of {name}, not a counter")
    assert not problems, "\n".join(problems)
    used = {family_name(n) for _, expr in queries(load_dashboard()) for n in queried_metrics(expr)}
    print(f"{len(used)} of {len(documented)} documented metrics on the dashboard")
    assert {"zmqflow_worker_examples", "zmqflow_ps_version", "zmqflow_worker_loss", "zmqflow_validation_metric",
            "zmqflow_broker_queue_size", "zmqflow_ps_push_staleness_steps", "zmqflow_aggregator_member_healthy",
            "zmqflow_aggregator_member_timeouts", "zmqflow_rpc_request_duration_seconds"} <= used


def test_a_query_naming_an_unknown_metric_is_caught():
    assert queried_metrics('sum by (task) (rate(zmqflow_worker_examples_per_second{task=~"$task"}[5m]))') == \
        {"zmqflow_worker_examples_per_second"}
    assert "zmqflow_worker_examples_per_second" not in documented_metrics()
