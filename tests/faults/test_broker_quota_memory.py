"""Issue: the broker's byte quota counted element data only; a queue filled with int8 scalars up to
its quota took about 145 times the quota in RSS (each element's tuple and array object cost ~170
bytes for 1 byte of data). The quota now counts what an element costs the broker: filling a queue
of scalars until the quota refuses keeps the broker's RSS growth within 2x the quota."""

import numpy as np
import pytest

from zmqflow.common.errors import ResourceExhaustedError
from zmqflow.common.clients.queues import FIFOQueue
from tests.faults.test_oversized_messages import rss_bytes

pytestmark = pytest.mark.faults

QUOTA = 16 * 1024 * 1024


def test_a_queue_of_int8_scalars_filled_to_the_quota_stays_within_twice_it_in_memory(processes):
    broker = processes.service("zmqflow.services.broker", ["--max-total-bytes", str(QUOTA)])
    queue = FIFOQueue(-1, ["int8"], shapes=[[]], shared_name="scalars", broker=broker.endpoint)
    before = rss_bytes(broker.pid)
    batch, stored = np.ones(10_000, np.int8), 0
    with pytest.raises(ResourceExhaustedError, match="max_total_bytes"):
        for _ in range(10_000):
            queue.enqueue_many([batch], timeout=10)
            stored += len(batch)
    grown = rss_bytes(broker.pid) - before
    print(f"\n{stored:,} int8 scalars held under a {QUOTA / 2**20:.0f} MiB quota: RSS grew {grown / 2**20:.1f} MiB "
          f"({grown / QUOTA:.2f}x the quota)")
    assert 50_000 < stored < QUOTA and grown <= 2 * QUOTA
    assert queue.size() == stored
