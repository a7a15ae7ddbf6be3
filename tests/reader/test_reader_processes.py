"""Reader processes on one pipeline: exactly-once delivery, one close after all finish, a killed reader is an error."""

import collections
import json
import re
import time

import numpy as np
import pytest

from zmqflow.common.clients import queues
from zmqflow.common.errors import AbortedError, NotFoundError, OutOfRangeError
from zmqflow.jobs.local_cluster import start_readers
from tests.reader.conftest import ID_OPTIONS
from tests.support import wait_for

pytestmark = pytest.mark.integration

def readers(broker, processes, count, queue, pattern, **options):
    """`count` reader processes on one pipeline, registered with `processes` to be stopped."""
    options = {"files": [pattern], "format_kind": "csv", "format_options": json.dumps(ID_OPTIONS), "queue": queue,
               "progress_every": 0, "heartbeat_timeout_secs": 1.5, **options}
    return [processes.adopt(proc) for proc in start_readers(broker, processes=count, log_dir=processes.log_dir,
                                                            stats_dir=processes.log_dir, **options)]


def drain_ids(queue, limit_s=60):
    """Every id until OutOfRange, all within `limit_s` (each dequeue waits only for the time left)."""
    ids, deadline = [], time.monotonic() + limit_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            ids.append(queue.dequeue_up_to(250, timeout=min(20, left))["id"])
        except OutOfRangeError:
            return np.concatenate(ids)
    raise AssertionError(f"the queue did not end within {limit_s} s")


def wait_for_state(broker, queue, predicate, limit_s=30):
    """The broker's state of the queue's producers once predicate(state) holds; bounded."""
    def matching_state():
        try:
            state = queues.attach(queue, broker=broker, timeout=0).producers()
        except NotFoundError:   # no queue, or no producer registered yet
            return None
        return state if predicate(state) else None
    return wait_for(matching_state, limit_s, f"pipeline {queue!r} to reach the expected state", interval=0.1)


def all_reading(count):
    return lambda s: len(s["producers"]) == count and all(p["progress"].get("reading")
                                                           for p in s["producers"].values())


def exit_codes(procs, timeout=30):
    return [p.proc.wait(timeout) for p in procs]


def stats(tmp_path, indices):
    """The summaries the reader processes of `indices` wrote at exit."""
    return [json.loads((tmp_path / f"reader-{i}.json").read_text()) for i in indices]


def test_three_reader_processes_deliver_every_instance_twice_then_out_of_range(broker, id_shards, processes,
                                                                               tmp_path):
    pattern, rows = id_shards
    procs = readers(broker, processes, 3, "e2e-procs", pattern, num_epochs=2, queue_kind="shuffle",
                    capacity=1500, min_after_dequeue=500, seed=3)
    ids = drain_ids(queues.attach("e2e-procs", broker=broker, timeout=30))
    assert exit_codes(procs) == [0, 0, 0], [p.log()[-2000:] for p in procs]
    assert len(ids) == 2 * rows and set(collections.Counter(ids.tolist()).values()) == {2}
    summaries = stats(tmp_path, range(3))
    assert {s["outcome"] for s in summaries} == {"ok"} and sum(s["files_done"] for s in summaries) == 16
    assert len({s["closed_by"] for s in summaries}) == 1


def test_two_reader_services_close_the_queue_once_after_both_finished(broker, id_shards, processes, tmp_path):
    pattern, rows = id_shards
    procs = readers(broker, processes, 2, "two-services", pattern, num_epochs=1, queue_kind="fifo", capacity=300,
                    chunk_size=50)
    queue = queues.attach("two-services", broker=broker, timeout=30)
    state = wait_for_state(broker, "two-services", all_reading(2))  # both hold a file: neither may close
    assert state["closed"] is None and not queue.is_closed()
    ids = drain_ids(queue)
    assert exit_codes(procs) == [0, 0], [p.log()[-2000:] for p in procs]
    assert sorted(ids.tolist()) == list(range(rows))
    state = wait_for_state(broker, "two-services", lambda s: s["closed"] is not None)
    summaries = stats(tmp_path, range(2))
    members = {s["member"] for s in summaries}
    assert state["closed"] == "ok" and set(state["producers"]) == members
    assert all(p["done"] for p in state["producers"].values())
    assert all(s["files_done"] > 0 for s in summaries)  # both really read
    closers = [p for p in procs if "closed the instance queue" in p.log()]
    assert len(closers) == 1 and state["closed_by"] in members


@pytest.mark.faults
def test_a_reader_process_killed_mid_file_is_an_error_for_the_consumer(broker, id_shards, processes, tmp_path):
    pattern, _ = id_shards
    procs = readers(broker, processes, 3, "killed", pattern, num_epochs=2, queue_kind="shuffle", capacity=200,
                    min_after_dequeue=50, chunk_size=50)
    queue = queues.attach("killed", broker=broker, timeout=30)
    wait_for_state(broker, "killed", all_reading(3))  # everyone blocked mid-file on a full queue
    victim = procs[1]
    victim.kill()
    with pytest.raises(AbortedError) as caught:  # noticed within 15 s of the kill
        drain_ids(queue, limit_s=15)
    survivors = [procs[0], procs[2]]
    assert exit_codes(survivors) == [1, 1]  # the pipeline failed: non-zero
    assert re.search(rf"reader@\S+:{victim.pid} stopped beating .* while reading .*shard-", str(caught.value))
    assert all(str(victim.pid) in s["error"] for s in stats(tmp_path, [0, 2]))  # each names the dead reader


@pytest.mark.faults
def test_when_every_reader_is_killed_the_consumer_itself_finds_them_dead(broker, id_shards, processes):
    pattern, _ = id_shards
    procs = readers(broker, processes, 1, "all-killed", pattern, num_epochs=1, queue_kind="fifo", capacity=100,
                    chunk_size=50)
    queue = queues.attach("all-killed", broker=broker, timeout=30)
    wait_for_state(broker, "all-killed", all_reading(1))
    procs[0].kill()
    with pytest.raises(AbortedError, match=rf":{procs[0].pid} stopped beating"):  # within 15 s
        drain_ids(queue, limit_s=15)
