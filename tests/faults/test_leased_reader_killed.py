"""At-least-once readers: a reader SIGKILLed mid-file does not fail the pipeline; its file is read again.

In the default mode a reader killed mid-file fails the pipeline (test_only_reader_killed.py). With
--at-least-once its leased file name goes back to the queue when its connection drops, the other
reader reads the whole file again, the broker drops the dead producer, and the consumer gets every
row at least once (the rows the dead reader had pushed, twice), then OutOfRange. When every reader
is gone with input left, the consumer fails after the rejoin wait instead of hanging.
"""

import collections
import gzip
import json
import time

import numpy as np
import pytest

from zmqflow.common.clients import queues
from zmqflow.common.errors import AbortedError, NotFoundError, OutOfRangeError
from zmqflow.jobs.local_cluster import start_readers
from tests.reader import data_path
from tests.reader.conftest import ID_OPTIONS, write_shards
from tests.support import wait_for

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def id_shards(tmp_path_factory):
    """8 CSV shards of the 5,000 MNIST rows with an id column: (glob pattern, number of rows)."""
    with gzip.open(data_path("mnist_5k.csv.gz")) as f:
        lines = f.read().splitlines(keepends=True)
    directory = tmp_path_factory.mktemp("id-shards")
    write_shards(directory, lines, 8, with_id=True)
    return str(directory / "shard-*.csv"), len(lines)


def leased_readers(broker, processes, count, queue, pattern, **options):
    options = {"files": [pattern], "format_kind": "csv", "format_options": json.dumps(ID_OPTIONS), "queue": queue,
               "queue_kind": "fifo", "capacity": 300, "chunk_size": 50, "num_epochs": 1, "progress_every": 0,
               "heartbeat_timeout_secs": 1.5, "at_least_once": True, **options}
    return [processes.adopt(proc) for proc in start_readers(broker, processes=count, log_dir=processes.log_dir,
                                                            **options)]


def state_of(broker, queue):
    """The broker's state of the queue's producers, or None while no reader has registered yet."""
    try:
        return queues.attach(queue, broker=broker, timeout=0).producers()
    except NotFoundError:
        return None


def every_member_reading(broker, queue, count):
    state = state_of(broker, queue)
    return state is not None and len(state["producers"]) == count and all(
        p["progress"].get("reading") for p in state["producers"].values())


def drain_ids(queue, limit_s):
    ids, deadline = [], time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            ids.append(queue.dequeue_up_to(250, timeout=min(10, left))["id"])
        except OutOfRangeError:
            return np.concatenate(ids)
    raise AssertionError(f"the queue did not end within {limit_s} s")


def test_a_reader_killed_mid_file_is_dropped_and_its_file_read_again(broker, id_shards, processes):
    pattern, rows = id_shards
    procs = leased_readers(broker, processes, 2, "alo-killed", pattern)
    queue = queues.attach("alo-killed", broker=broker, timeout=30)
    wait_for(lambda: every_member_reading(broker, "alo-killed", 2), 30, "both readers mid-file")
    victim, survivor = procs
    victim.kill()
    killed = time.monotonic()
    ids = drain_ids(queue, limit_s=30)
    took = time.monotonic() - killed
    assert survivor.proc.wait(10) == 0, survivor.log()[-2000:]
    state = state_of(broker, "alo-killed")
    counts = collections.Counter(ids.tolist())
    twice = sum(1 for c in counts.values() if c > 1)
    print(f"\nat-least-once reader SIGKILLed mid-file: pipeline {state['closed']}, every row of {rows} delivered "
          f"({len(ids)} in all, {twice} twice: the dead reader's file read again), queue ended {took:.1f} s after "
          f"the kill")
    assert set(counts) == set(range(rows)) and max(counts.values()) <= 2    # none lost
    assert state["closed"] == "ok" and [f":{survivor.pid}" in m for m in state["producers"]] == [True]  # victim dropped
    assert took <= 20.0


def test_with_every_leased_reader_gone_the_consumer_fails_after_the_rejoin_wait(broker, id_shards, processes):
    pattern, _ = id_shards
    (reader,) = leased_readers(broker, processes, 1, "alo-orphaned", pattern, rejoin_wait=2.0)
    queue = queues.attach("alo-orphaned", broker=broker, timeout=30)
    wait_for(lambda: every_member_reading(broker, "alo-orphaned", 1), 30, "the reader mid-file")
    reader.kill()
    killed = time.monotonic()
    with pytest.raises(AbortedError, match="no live reader left .* none joined again within 2 s"):
        drain_ids(queue, limit_s=20)
    took = time.monotonic() - killed
    print(f"\nthe only at-least-once reader SIGKILLed: the consumer failed {took:.1f} s after the kill "
          f"(lease 1.5 s + rejoin wait 2 s)")
    assert took <= 10.0
