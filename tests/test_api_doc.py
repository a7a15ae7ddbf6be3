"""docs/api.md runs as written: every Python block, in order, in one namespace, with real processes
(a Job), ps tasks in threads, a broker and producers; what it prints is checked where it matters."""

import os
import re

import pytest

from tests.support.processes import alive

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "api.md")

pytestmark = pytest.mark.integration


def test_the_api_doc_runs_as_written(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with open(DOC) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 6
    scope = {}
    for block in blocks:
        exec(compile(block, DOC, "exec"), scope)
    job, summary = scope["job"], scope["summary"]
    assert job.status == "finished" and summary["test_metrics"]["accuracy"] > 0.9
    assert not [pid for pid in job.pids() if alive(pid)]
    assert scope["info"]["predicted"] == ["a", "c"] and scope["outputs"].shape == (2, 3)   # served from the job's checkpoint
    assert (scope["server"].replica, scope["server"].is_chief) == (2, False)
    assert scope["accuracy"] > 0.85
    assert len(scope["own"].means) == 3 and scope["own"].means[-1] < scope["own"].means[0]   # 2 x 150 batches
    assert scope["validation"].best["accuracy"] > 0.9
    assert os.path.exists(os.path.join(scope["work"], "summaries.jsonl"))
