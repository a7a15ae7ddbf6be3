"""docs/serving.md's curl infer runs as written against a real gateway (its Python blocks run in tests/test_docs.py)."""

import json
import shutil
import subprocess

import pytest

from tests.support.doc_blocks import blocks

pytestmark = pytest.mark.service


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_curl_infer_runs_as_written(topology):
    command = next(block.body for block in blocks("docs/serving.md") if block.language == "bash"
                   and block.body.startswith("curl"))
    done = subprocess.run(["bash", "-c", command.replace("localhost:8000", topology.gateway)], capture_output=True,
                          text=True, timeout=30)
    answer = json.loads(done.stdout)
    assert answer["outputs"][0]["shape"] == [1, 10] and answer["parameters"]["answered_count"] == 3, done.stderr
