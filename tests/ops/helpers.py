"""Scraping a task's /metrics and reading its JSON logs, for the ops tests."""

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from zmqflow.common.rpc.client import RpcClient


def metrics_url(endpoint):
    """The /metrics URL a service announces in its `info` answer."""
    with RpcClient(endpoint) as client:
        return client.call("info", timeout=5.0)[0]["metrics"]


def scrape_text(url):
    """The exposition text of one scrape."""
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.read().decode()


def scrape(url):
    """{sample name: {frozenset(labels.items()): value}} of one scrape."""
    samples = {}
    for family in text_string_to_metric_families(scrape_text(url)):
        for s in family.samples:
            samples.setdefault(s.name, {})[frozenset(s.labels.items())] = s.value
    return samples


def value(samples, name, **labels):
    """The sum of `name`'s samples whose labels include `labels` (0 when none)."""
    want = set(labels.items())
    return sum(v for key, v in samples.get(name, {}).items() if want <= set(key))


def json_lines(text):
    """The log's JSON lines, parsed (other lines, e.g. a library's print, are skipped)."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]
