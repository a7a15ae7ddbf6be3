"""Soak: a training job as `zmqflow train` runs it (a reader feeding a shuffle queue of 20,000 MNIST rows on the
broker, 1 ps, 2 workers; the numpy backend, no JIT to wait for), with epochs enough to outlast the soak. Once the
workers are stepping, the broker, the ps, both workers and the reader are sampled for ZMQFLOW_SOAK_SECS, then the
job is stopped. The broker may grow by its queue's capacity besides the usual bound (the queue fills as fast as the
reader outpaces the workers); nothing else may. Issue 27: the broker kept nearly every element the reader sent
through it (about 1 GB every 15 s); this fails on that code.
"""

import time

import pytest

from zmqflow.common.clients.queues import attach
from zmqflow.jobs.local_cluster import LocalCluster
from tests.support import wait_for
from tests.support.soak import MB, Bounds, Sampler, check, soak_seconds, soak_timeout

pytestmark = [pytest.mark.integration, pytest.mark.soak, pytest.mark.timeout(soak_timeout())]

EPOCHS = 100_000            # 4,500 rows an epoch: far more than any soak gets through
CAPACITY = 20_000           # the readers' shuffle queue (jobs/local_cluster.py)
ROW_BYTES = 784 * 4 + 4     # an image and its label


def global_step(cluster):
    return cluster.ps_stats(0)["version"]


def test_training_job(tmp_path):
    seconds = soak_seconds()
    with LocalCluster(epochs=EPOCHS, backend="numpy", log_dir=str(tmp_path)) as cluster:
        cluster.start()
        wait_for(lambda: global_step(cluster) >= 20, timeout=60, what="the workers' first 20 steps",
                 retry_on=Exception)
        queue = attach("train", broker=cluster.broker.endpoint)
        pids = {"broker": cluster.broker.pid, "ps": cluster.shards[0].pid, "reader": _reader(cluster).pid,
                **{f"worker {i}": worker.pid for i, worker in enumerate(cluster.workers)}}
        first, held = global_step(cluster), [queue.size()]
        with Sampler(pids) as sampler:
            time.sleep(seconds)
        steps = global_step(cluster) - first
        held.append(queue.size())
    print(f"\nthe queue held {held[0]} rows when sampling began, {held[1]} at its end (capacity {CAPACITY})")
    for name in pids:
        bounds = Bounds(rss_mb=Bounds.rss_mb + CAPACITY * ROW_BYTES / MB) if name == "broker" else Bounds()
        check(name, sampler, steps, f"steps of {cluster.spec.training.batch_size} examples", seconds, bounds)


def _reader(cluster):
    readers = [child for child in cluster.supervisor.children if child.name.startswith("reader")]
    assert len(readers) == 1, [child.name for child in cluster.supervisor.children]
    return readers[0]
