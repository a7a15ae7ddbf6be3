"""docs/broker.md, the queue broker tour (the README's first tour until issue 24), runs as written (against a broker
on a free port)."""

import os

import pytest

pytestmark = pytest.mark.service

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_broker_tour_python_runs(broker):
    with open(os.path.join(ROOT, "docs", "broker.md")) as f:
        source = f.read().split("```python")[1].split("```")[0]
    scope = {}
    exec(compile(source.replace("tcp://127.0.0.1:5555", broker), "docs/broker.md", "exec"), scope)
    assert len(scope["y"]) == 26 and scope["y"][-1] == 19
    from zmqflow.common.clients.queues import reset
    reset("", broker=broker)
