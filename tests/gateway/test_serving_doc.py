"""docs/serving.md's HTTP examples run as written against a real gateway: the curl infer and the tritonclient snippet."""

import json
import os
import re
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.service

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "serving.md")


def doc_text():
    with open(DOC) as f:
        return f.read()


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_curl_infer_runs_as_written(topology):
    command = next(block for block in re.findall(r"```bash\n(.*?)```", doc_text(), re.S) if block.startswith("curl"))
    done = subprocess.run(["bash", "-c", command.replace("localhost:8000", topology.gateway)], capture_output=True,
                          text=True, timeout=30)
    answer = json.loads(done.stdout)
    assert answer["outputs"][0]["shape"] == [1, 10] and answer["parameters"]["answered_count"] == 3, done.stderr


def test_the_tritonclient_snippet_runs_as_written(topology):
    pytest.importorskip("tritonclient.http")
    source = re.findall(r"```python\n(.*?)```", doc_text(), re.S)[0]
    scope = {}
    exec(compile(source.replace("localhost:8000", topology.gateway.removeprefix("http://")), "docs/serving.md",
                 "exec"), scope)
    assert scope["probabilities"].shape == (4, 10) and len(scope["answered"].split(",")) == 3
    scope["client"].close()
