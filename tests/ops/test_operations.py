"""Operating a live job: Prometheus metrics of a real broker, ps and worker, JSON logs naming the task,
the chief's TensorBoard event file read back, and `zmqflow status --once --json` (a dead address down)."""

import glob
import json
import subprocess
import sys

import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from zmqflow.inputs.datasets import mnist_split
from zmqflow.common.errors import DeadlineExceededError
from zmqflow.models.spec import MNIST_MLP
from zmqflow.common.clients.queues import FIFOQueue
from zmqflow.inputs.formats.tfrecord import iter_records
from tests.ops.helpers import json_lines, metrics_url, scrape, value
from tests.support import free_port, wait_for

pytestmark = pytest.mark.integration

OPS = ["--metrics-bind", "0", "--log-format", "json"]


@pytest.fixture(scope="module")
def job(module_processes):
    """A broker and a ps shard serving metrics and JSON logs; stopped by PID at the end."""
    return (module_processes.service("zmqflow.services.broker", OPS),
            module_processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP), *OPS]))


def test_broker_metrics_move_with_traffic(job):
    broker, _ = job
    url = metrics_url(broker.endpoint)
    assert url.startswith("http://127.0.0.1:")
    q = FIFOQueue(50, ["float32"], shapes=[[4]], shared_name="ops-m", broker=broker.endpoint)
    before = scrape(url)
    assert value(before, "zmqflow_task_info", task="broker:0") == 1
    q.enqueue_many([np.zeros((7, 4), np.float32)])
    q.dequeue()
    with pytest.raises(DeadlineExceededError):
        FIFOQueue(5, ["float32"], shapes=[[4]], shared_name="ops-empty", broker=broker.endpoint).dequeue(timeout=0.05)
    after = scrape(url)
    queue = {"queue": "ops-m", "kind": "FIFOQueue"}
    assert value(after, "zmqflow_broker_queue_size", **queue) == 6
    assert value(after, "zmqflow_broker_queue_capacity", **queue) == 50
    assert value(after, "zmqflow_broker_queues") >= 2
    assert value(after, "zmqflow_rpc_requests_total", service="queue-broker", op="enqueue_many", code="OK") == 1
    assert value(after, "zmqflow_rpc_requests_total", op="dequeue", code="DEADLINE_EXCEEDED") == 1
    # latency histograms: counts per op, microsecond buckets, the parked dequeue's wait
    assert value(after, "zmqflow_rpc_request_duration_seconds_count", op="dequeue") == 2
    assert ("le", "1e-05") in {kv for key in after["zmqflow_rpc_request_duration_seconds_bucket"] for kv in key}
    assert value(after, "zmqflow_rpc_wait_seconds_count", op="dequeue") == 1
    assert value(after, "zmqflow_rpc_wait_seconds_sum", op="dequeue") >= 0.04
    assert value(after, "process_resident_memory_bytes") > 0


def test_training_metrics_tensorboard_status_and_json_logs(job, module_processes, tmp_path):
    broker, ps = job
    (x, y), _ = mnist_split()
    queue = FIFOQueue(2000, ["float32", "int32"], shapes=[[784], []], names=["image", "label"],
                      shared_name="train", broker=broker.endpoint)
    queue.enqueue_many({"image": x[:300], "label": y[:300]})
    summaries = tmp_path / "tb"
    # started by the broker and ps's launcher, so it holds their job's admin token (the chief runs init)
    worker = module_processes.process("zmqflow.services.worker", ["--broker", broker.endpoint, "--ps", ps.endpoint,
                                                          "--evaluate", "--summary-dir", str(summaries),
                                                          "--summary-every-steps", "1", *OPS], name="chief")
    started = wait_for(lambda: [e for e in json_lines(worker.log()) if e["message"].startswith("metrics on ")],
                       60, "the worker's metrics endpoint")
    worker_url = started[0]["message"].split()[-1]
    wait_for(lambda: value(scrape(worker_url), "zmqflow_worker_steps_total") == 3, 60, "3 steps")
    samples = scrape(worker_url)
    assert value(samples, "zmqflow_worker_examples_total", task="worker:0") == 300
    assert value(samples, "zmqflow_worker_global_step") >= 2
    ps_samples = scrape(metrics_url(ps.endpoint))
    assert value(ps_samples, "zmqflow_ps_version", shard="0") == 3
    assert value(ps_samples, "zmqflow_ps_pushes_received_total") == 3
    assert value(ps_samples, "zmqflow_ps_push_staleness_steps_count") == 3
    assert value(ps_samples, "zmqflow_rpc_requests_total", service="ps-shard", op="push", code="OK") == 3

    status = _status(["--broker", broker.endpoint, "--ps", ps.endpoint, "--serve", f"127.0.0.1:{free_port()}",
                      "--worker-metrics", worker_url])
    assert status.returncode == 1, status.stderr  # the dead model server
    snap = json.loads(status.stdout)
    tasks = {t["job"]: t for t in snap["tasks"]}
    assert tasks["broker"]["status"] == "up" and tasks["ps"]["status"] == "up"
    assert tasks["serve"]["status"] == "down" and "Unavailable" in tasks["serve"]["error"]
    assert {q["shared_name"]: q["size"] for q in tasks["broker"]["detail"]["queues"]}["train"] == 0
    assert tasks["ps"]["detail"]["version"] == 3
    assert snap["workers"] == [{"replica": 0, "state": "training", "last_push_s": snap["workers"][0]["last_push_s"]}]
    assert snap["worker_metrics"][0]["status"] == "up" and snap["worker_metrics"][0]["steps_total"] == 3

    queue.close()
    assert worker.proc.wait(60) == 0, worker.log()

    events = [event_pb2.Event.FromString(r) for path in glob.glob(str(summaries / "events.out.tfevents.*"))
              for r in iter_records(path)]
    scalars = {}
    for event in events:
        for v in event.summary.value:
            scalars.setdefault(v.tag, []).append((event.step, v.simple_value))
    assert {"loss", "examples_per_sec", "global_step_per_sec", "staleness", "accuracy"} <= set(scalars)
    assert [step for step, _ in scalars["loss"]] == [0, 1, 2, 3]  # the global step each loss was computed at
    assert scalars["accuracy"][0][0] == 3 and 0.0 < scalars["accuracy"][0][1] <= 1.0
    assert all(rate > 0 for _, rate in scalars["examples_per_sec"][:3])
    # JSON logs: every line of every task parses and names its task
    for proc, task in ((broker, "broker:0"), (ps, "ps:0"), (worker, "worker:0")):
        lines = json_lines(proc.log())
        assert lines and all(e["task"] == task and {"time", "level", "logger", "message"} <= set(e) for e in lines)
    assert all(line.startswith("{") for line in ps.log().splitlines() if line.strip())


@pytest.mark.service
def test_status_text_view_and_a_cluster_with_nothing_up():
    result = _status(["--ps", f"127.0.0.1:{free_port()}"], json_output=False)
    assert result.returncode == 1
    assert "ps:0" in result.stdout and "down" in result.stdout and "UnavailableError" in result.stdout
    missing = subprocess.run([sys.executable, "-m", "zmqflow", "status", "--once"], capture_output=True, text=True,
                             timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode == 2 and "no cluster" in missing.stderr


def _status(args, json_output=True):
    return subprocess.run([sys.executable, "-m", "zmqflow", "status", "--once", "--timeout-secs", "1", *args,
                           *(["--json"] if json_output else [])], capture_output=True, text=True, timeout=30)
