"""In-graph replication loses a replica: a ps, two replicas (worker tasks 0 and 1, each slicing the data
preloaded on the ps) and their client train; replica 1 is SIGKILLed mid-training. The client must end
within seconds (its waits are bounded: a replica silent for 3 s is lost) with the peer-lost exit code and an
error naming the replica by its task, in sync (it waits for every replica's gradients) and in async; the
surviving replica, its client gone, ends too: nothing of the job hangs."""

import json
import time

import pytest

from zmqflow.common.clients.ps import PsShardClient
from zmqflow.inputs.datasets import mnist_split
from zmqflow.models.spec import MNIST_MLP
from tests.support import wait_for

pytestmark = pytest.mark.faults

PEER_LOST = 3


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_killed_replica_ends_the_client_naming_it(processes, mode):
    (x, y), _ = mnist_split()
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)])
    stats = PsShardClient(ps.endpoint)
    stats.preload("train", {"image": x, "label": y}, timeout=30)
    replicas = [processes.service("zmqflow.services.worker", [
        "--in-graph", "--ps", ps.endpoint, "--preloaded", "train", "--epochs", "100", "--task-index", str(i),
        "--num-workers", "2", "--backend", "numpy"]) for i in range(2)]
    client = processes.process("zmqflow.services.worker", [
        "--ps", ps.endpoint, "--mode", mode, "--replica", replicas[0].endpoint, "--replica", replicas[1].endpoint,
        "--backend", "numpy", "--log-every", "20"])
    try:
        wait_for(lambda: stats.stats()["version"] >= 20, 60, "20 in-graph steps")
        replicas[1].kill()
        killed = time.monotonic()
        wait_for(lambda: not client.alive(), 15, "the client to end")
        took = time.monotonic() - killed
    finally:
        stats.close()
    print(f"\n{mode}: the client ended {took:.1f} s after replica 1 was killed, exit {client.returncode}")
    assert client.returncode == PEER_LOST and took <= 8.0, client.log()[-2000:]
    assert "in-graph replica /job:worker/task:1 at tcp://" in client.log() and "was lost" in client.log()
    wait_for(lambda: not replicas[0].alive(), 10, "the surviving replica to end")
    assert replicas[0].returncode == PEER_LOST and "its in-graph client went away" in replicas[0].log()
