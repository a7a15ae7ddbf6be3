"""docs/queues.md runs as written (against a broker on a free port) and prints what it says."""

import contextlib
import io
import os

import pytest

pytestmark = pytest.mark.service

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_queues_doc_python_runs_as_written(broker):
    with open(os.path.join(ROOT, "docs", "queues.md")) as f:
        source = f.read().split("```python")[1].split("```")[0]
    out, scope = io.StringIO(), {}
    with contextlib.redirect_stdout(out):
        exec(compile(source.replace("tcp://127.0.0.1:5555", broker), "docs/queues.md", "exec"), scope)
    printed = out.getvalue().splitlines()
    assert printed[0] == "[0 1 2 3]" and printed[1].startswith("[5 6 7 8 9]")
    assert scope["leased"].seconds == 120 and scope["leased"].settled and scope["q"].size() == 0
