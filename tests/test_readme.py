"""The README's tour runs as written (against a broker on a free port)."""

import os

import pytest

pytestmark = pytest.mark.service

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_python_tour_runs(broker):
    with open(os.path.join(ROOT, "README.md")) as f:
        source = f.read().split("```python")[1].split("```")[0]
    scope = {}
    exec(compile(source.replace("tcp://127.0.0.1:5555", broker), "README.md", "exec"), scope)
    assert len(scope["y"]) == 26 and scope["y"][-1] == 19
    from zmqflow.common.clients.queues import reset
    reset("", broker=broker)
