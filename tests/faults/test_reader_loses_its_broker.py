"""Issue: a reader whose broker was SIGKILLed exited 1 after about 23 s, one timeout per cleanup call
(record the failure, close two queues, read the record back). It must exit with the documented
code for a lost peer, 3, within the RPC deadline."""

import time

import pytest

from zmqflow.common.clients.broker import BrokerClient
from zmqflow.inputs.datasets import mnist_split, write_record_shards
from tests.support import wait_for

pytestmark = pytest.mark.faults


def test_a_reader_exits_3_within_seconds_when_its_broker_is_killed(processes, tmp_path):
    (x, y), _ = mnist_split()
    write_record_shards(x, y, str(tmp_path / "shards"))
    broker = processes.service("zmqflow.services.broker")
    reader = processes.process("zmqflow.services.reader", [
        "--broker", broker.endpoint, "--preset", "mnist-shards", "--files", str(tmp_path / "shards" / "*.bin"),
        "--num-epochs", "500", "--capacity", "2000"])
    with BrokerClient(broker.endpoint) as client:
        wait_for(lambda: any(q["name"] == "train" and q["size"] >= 2000 for q in client.list_queues()), 30,
                 "the reader to fill its queue")
    broker.kill()
    killed = time.monotonic()
    wait_for(lambda: not reader.alive(), 15, "the reader to exit")
    took = time.monotonic() - killed
    print(f"\nreader exit after its broker was killed: code {reader.returncode} in {took:.1f} s")
    assert reader.returncode == 3, reader.log()[-2000:]
    assert took < 8.0 and "lost the broker" in reader.log()
