"""The seeds' classic script on zmqflow's Python API (ClusterSpec, Server, MonitoredTrainingSession,
StopAtStepHook): 1 ps + 2 workers as separate processes on ephemeral ports, as a user would run it."""

import os
import subprocess
import sys

import pytest

import zmqflow
from zmqflow.common.errors import InvalidArgumentError
from tests.support.ports import free_port

pytestmark = pytest.mark.integration

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples",
                      "distributed_mnist.py")


def test_the_classic_script_trains_1_ps_and_2_workers_to_the_stop_step():
    ps, w0, w1 = (f"127.0.0.1:{free_port()}" for _ in range(3))
    done = subprocess.run([sys.executable, SCRIPT, "--local", "--ps_hosts", ps, "--worker_hosts", f"{w0},{w1}",
                           "--train_steps", "600"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    line = [row for row in done.stdout.splitlines() if row.startswith("distributed_mnist:")][0]
    accuracy, step = float(line.split()[3]), int(line.split()[-1])
    assert accuracy > 0.85 and 600 <= step <= 610       # StopAtStepHook: at most the steps in flight beyond it


def test_a_server_names_what_is_wrong_with_its_task():
    cluster = {"ps": [f"127.0.0.1:{free_port()}"], "worker": [f"127.0.0.1:{free_port()}"]}
    with pytest.raises(InvalidArgumentError, match="the cluster needs a ps job and a worker job"):
        zmqflow.Server({"worker": cluster["worker"]}, "worker", 0)
    worker = zmqflow.Server(cluster, "worker", 0)
    with pytest.raises(InvalidArgumentError, match="join\\(\\) serves a ps task; this is /job:worker/task:0"):
        worker.join()
    with pytest.raises(InvalidArgumentError, match="task"):
        zmqflow.Server(cluster, "worker", 3)
