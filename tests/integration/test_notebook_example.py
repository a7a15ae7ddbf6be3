"""examples/local_cluster_notebook.py, as `make examples` runs it: a CSV to a trained, evaluated model and
its predictions through zmqflow.local_cluster, the job's metrics streamed while it trains."""

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                      "local_cluster_notebook.py")


def test_the_notebook_trains_streams_evaluates_and_predicts():
    done = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    steps = [int(m) for m in re.findall(r"^step +(\d+) ", done.stdout, re.M)]
    assert len(steps) >= 2 and steps == sorted(steps) and steps[-1] == 630        # 30 epochs of 2,100 rows
    final = re.search(r"local_cluster_notebook: test accuracy (\S+), AUC (\S+) at global step 630", done.stdout)
    assert final and float(final.group(1)) > 0.8 and float(final.group(2)) > 0.9, done.stdout
    assert "{'class': 'yes'" in done.stdout and "{'class': 'no'" in done.stdout
