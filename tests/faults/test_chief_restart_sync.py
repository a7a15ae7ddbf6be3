"""Issue: a chief restarted in sync mode restored the last checkpoint onto every shard, which lowered
the ps version; the other worker's pull parked for the next step waited the 30 s sync timeout, and
every shard rolled back. Now the chief restores only shards that lost their state, versions never go
back, and training moves within 2 s of the restarted chief being ready."""

import json
import re
import threading
import time

import pytest

from zmqflow.common.clients.ps import PsShardClient
from zmqflow.inputs.datasets import mnist_split, write_record_shards
from zmqflow.models.spec import MNIST_MLP
from tests.support import wait_for

pytestmark = pytest.mark.faults


def test_a_restarted_sync_chief_resumes_without_rolling_back(processes, tmp_path):
    (x, y), _ = mnist_split()
    write_record_shards(x, y, str(tmp_path / "shards"))
    broker = processes.service("zmqflow.services.broker")
    ps = processes.service("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP), "--mode", "sync",
                                                  "--replicas-to-aggregate", "2", "--total-num-replicas", "2",
                                                  "--lost-after-secs", "30",   # the restart, not the lost-replica rule
                                                  "--checkpoint-root", str(tmp_path / "ckpt")])
    processes.process("zmqflow.services.reader", ["--broker", broker.endpoint, "--preset", "mnist-shards", "--files",
                                                  str(tmp_path / "shards" / "*.bin"), "--num-epochs", "40"])

    def worker(index):
        args = ["--broker", broker.endpoint, "--ps", ps.endpoint, "--num-workers", "2", "--task-index", str(index),
                "--mode", "sync", "--backend", "numpy", "--log-every", "50"]
        if index == 0:
            args += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every-steps", "20"]
        return processes.process("zmqflow.services.worker", args)

    chief, _ = worker(0), worker(1)
    versions, stop = [], threading.Event()
    with PsShardClient(ps.endpoint) as client:
        wait_for(lambda: client.stats()["version"] >= 60, 60, "sync training past a checkpoint")

    def follow():
        with PsShardClient(ps.endpoint) as watcher:
            while not stop.wait(0.05):
                versions.append((time.monotonic(), watcher.stats()["version"]))
    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        assert " stops: " not in chief.log(), chief.log()[-2000:]   # the first chief trained until the kill
        chief.kill()
        time.sleep(1.0)
        restarted = worker(0)
        wait_for(lambda: "nothing to restore" in restarted.log(), 60, "the restarted chief to be ready")
        ready = time.monotonic()
        at_ready = max(v for t, v in versions if t <= ready)
        wait_for(lambda: versions[-1][1] > at_ready + 5, 10, "training to move after the restart")
        moved = next(t for t, v in versions if t > ready and v > at_ready) - ready
    finally:
        stop.set()
        follower.join(5)
    drops = [(a, b) for (_, a), (_, b) in zip(versions, versions[1:]) if b < a]
    print(f"\nsync training moved {moved:.2f} s after the restarted chief was ready; version never went back "
          f"({len(versions)} samples, {versions[0][1]} -> {versions[-1][1]})")
    assert not drops and moved <= 2.0
    assert " stops: " not in restarted.log(), restarted.log()[-2000:]
    assert re.search(r"the 1 ps shards kept their state \(step \d+\)", restarted.log())
