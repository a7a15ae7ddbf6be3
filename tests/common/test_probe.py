"""The one liveness probe against a real broker, and against an address where nothing answers."""

import pytest
import zmq

from zmqflow.common.clients.broker import BrokerClient
from zmqflow.common.rpc.probe import probe
from zmqflow.common.clients.queues import FIFOQueue, reset

pytestmark = pytest.mark.service


def test_a_live_broker_is_up_with_its_info_and_queues(broker):
    FIFOQueue(5, ["int32"], shapes=[[]], shared_name="probed", container="probe-test", broker=broker)
    try:
        answer = probe(broker.replace("tcp://", ""), timeout=2.0, detail=True)   # host:port works too
        assert answer.up and answer.error is None and answer.rtt_s > 0
        assert answer.address == broker and answer.info["service"] == "queue-broker"
        assert "probed" in [q["name"] for q in answer.detail["queues"]]
        with BrokerClient(broker) as client:
            assert [q["name"] for q in client.list_queues()] == [q["name"] for q in answer.detail["queues"]]
            assert client.info()["pid"] == answer.info["pid"]
    finally:
        reset("probe-test", broker=broker)


@pytest.mark.timeout(20)
def test_a_silent_address_is_down_with_the_reason_not_an_exception():
    silent = zmq.Context.instance().socket(zmq.ROUTER)   # accepts the connection, never answers
    silent.linger = 0
    silent.bind("tcp://127.0.0.1:*")
    try:
        answer = probe(silent.getsockopt_string(zmq.LAST_ENDPOINT), timeout=0.3)
        assert not answer.up and answer.info is None
        assert answer.error.startswith(("UnavailableError", "DeadlineExceededError")), answer.error
        assert answer.waited_s is not None
    finally:
        silent.close()
