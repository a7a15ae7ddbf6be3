"""In-graph replication with real processes: one client drives two worker tasks as replicas, each reading
its own share of the input; sync averages their gradients into one update a step, async pushes each
replica's as it finishes. The targets are test_training.py's for between-graph on the same data."""

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

import zmqflow
from zmqflow.cli.main import main
from zmqflow.common.clients.ps import PsShardClient
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.spec import MNIST_MLP
from tests.integration.test_training import ASYNC_TARGET, SEED, TARGET
from tests.support import wait_for

pytestmark = pytest.mark.integration

DEVICES = ["/job:worker/task:0", "/job:worker/task:1"]


def test_sync_two_replicas_reach_the_target_with_one_update_a_step():
    # two ps shards, as test_training's sync test: the replicas pull at each shard's version
    summary = zmqflow.replicate(DEVICES, mode="sync", num_ps=2, epochs=10, seed=SEED).run(timeout=300)
    assert summary["worker_exit_codes"] == [0, 0, 0]          # the client, then the two replicas
    assert summary["test_accuracy"] >= TARGET, summary
    assert summary["examples"] == 10 * 4500                  # every row trained on once an epoch, by one replica
    assert summary["steps"] == summary["global_step"]         # one update a step, not one per replica
    assert summary["global_step"] <= 10 * 4500 // 200 + 2     # each step two batches (the last may be one)
    assert [r["replica"] for r in summary["replicas"]] == DEVICES
    assert sum(r["examples"] for r in summary["replicas"]) == 10 * 4500


def test_async_from_the_command_line_pushes_one_update_a_replica_step(tmp_path):
    out = subprocess.run([sys.executable, "-m", "zmqflow", "train", "--replication", "in-graph", "--mode",
                          "async", "--num-workers", "2", "--epochs", "10", "--input", "ps", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["replication"] == "in-graph" and summary["mode"] == "async"
    assert summary["test_accuracy"] >= ASYNC_TARGET, summary
    replica_steps = [r["steps"] for r in summary["replicas"]]
    assert min(replica_steps) > 0 and sum(replica_steps) == summary["steps"] == summary["global_step"], summary
    assert summary["examples"] == 10 * 4500


@pytest.mark.parametrize("args,says", [
    (["--replication", "in-graph", "--spare-replicas", "1"], "spare replicas are between-graph sync's"),
    (["--replication", "in-graph", "--num-workers", "2", "--device", "/gpu:0"], "names 1 devices for 2 workers"),
    (["--replication", "in-graph", "--num-workers", "2", "--device", "/gpu:0", "--device", "/job:worker/task:0"],
     "replica 1's device '/job:worker/task:0': replica 1 runs as /job:worker/task:1"),
    (["--device", "/gpu:0"], "places the replicas of --replication in-graph"),
])
def test_in_graph_options_that_make_no_job_are_usage_errors_naming_why(args, says):
    result = CliRunner().invoke(main, ["train", *args])
    assert result.exit_code == 2 and says in result.output, result.output


def test_replicate_refuses_a_device_of_another_task_before_starting_anything():
    with pytest.raises(InvalidArgumentError, match="replica 0 runs as /job:worker/task:0"):
        zmqflow.replicate(["/job:worker/task:1"])


def test_a_client_refuses_ps_shards_that_aggregate_sync_pushes_themselves(processes):
    """Between-graph sync's ps waits for several workers' pushes a step; an in-graph client pushes once a step
    (or lets each replica push), so it says what to change instead of waiting out a timeout."""
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP), "--mode", "sync",
                                                  "--replicas-to-aggregate", "2"])
    with PsShardClient(ps.endpoint) as shard:
        shard.preload("train", {"image": np.zeros((200, 784), np.float32), "label": np.zeros(200, np.int64)})
    replica = processes.service("zmqflow.services.worker", ["--in-graph", "--ps", ps.endpoint, "--preloaded", "train",
                                                           "--backend", "numpy"])
    client = processes.process("zmqflow.services.worker", ["--ps", ps.endpoint, "--mode", "sync", "--replica",
                                                          replica.endpoint, "--backend", "numpy"])
    wait_for(lambda: not client.alive(), 30, "the client to end")
    assert client.returncode == 1 and "ps shards [0] run the sync rule" in client.log(), client.log()[-2000:]
    assert "start the shards with --mode async" in client.log()


def test_an_in_graph_job_renders_replicas_a_client_chief_and_shards_that_apply_each_push():
    """What LocalCluster starts: the shards without the sync rule (the client pushes once a step), the workers as
    replicas on their devices with nothing of the chief, and the client with the chief's part."""
    from zmqflow.jobs.spec import Placement, job_spec, tasks
    spec = job_spec(num_ps=2, num_workers=2, mode="sync", replication="in-graph", devices=("/cpu:0", "/gpu:1"))
    rendered = tasks(spec, Placement("tcp://127.0.0.1:5555", ps=("tcp://a:1", "tcp://b:2"), log_dir="/tmp/j"))
    ps = [t for t in rendered if t.role == "ps"]
    replicas = [t for t in rendered if t.role == "worker"]
    (client,) = [t for t in rendered if t.role == "client"]
    assert len(ps) == 2 and all(t.options["mode"] is None and t.options["replicas-to-aggregate"] is None for t in ps)
    assert [t.options["device"] for t in replicas] == ["/cpu:0", "/gpu:1"]
    assert all(t.options["in-graph"] and "checkpoint-dir" not in t.options and "json-out" not in t.options
               for t in replicas)
    assert client.command == ["worker"] and client.options["mode"] == "sync" and client.options["shutdown-ps"]
    assert client.options["json-out"] == "/tmp/j/client-result.json" and "checkpoint-dir" in client.options
