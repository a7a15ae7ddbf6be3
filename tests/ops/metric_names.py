"""The metric names docs/metrics.md documents and those a PromQL expression queries, for the tests that
hold the docs, the dashboard and the exporters to one list."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
METRICS_DOC = os.path.join(ROOT, "docs", "metrics.md")
DASHBOARD = os.path.join(ROOT, "deploy", "grafana", "zmqflow-dashboard.json")
SAMPLE_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def documented_metrics():
    """{family name (counters without `_total`): kind} from docs/metrics.md's reference table."""
    kinds = {}
    with open(METRICS_DOC) as f:
        for line in f:
            if line.startswith("| `zmqflow_"):
                cells = [c.strip() for c in line.split("|")]
                kinds[family_name(cells[1].strip("`"))] = cells[2]
    return kinds


def family_name(sample_name):
    """zmqflow_worker_steps_total -> zmqflow_worker_steps; histogram samples -> the histogram."""
    for suffix in SAMPLE_SUFFIXES:
        if sample_name.endswith(suffix):
            return sample_name[:-len(suffix)]
    return sample_name


def queried_metrics(expr):
    """The zmqflow_* sample names a PromQL expression reads (label names inside {...} and by(...) are not)."""
    return set(re.findall(r"\bzmqflow_[a-z0-9_]+", re.sub(r"\{[^}]*\}", "", expr)))
