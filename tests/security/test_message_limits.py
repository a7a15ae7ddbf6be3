"""Oversize requests get a clear INVALID_ARGUMENT naming max_message_bytes and the size, never silence.

A request up to twice the limit reaches the service, which answers it. One
beyond that is dropped by ZeroMQ's MAXMSGSIZE (the connection is cut, nothing
is answered); the client learns the service's limit from its heartbeat answers
and names it, and from then on refuses such requests before sending them.
"""

import threading

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.wire.limits import Limits
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.rpc.service import Service

pytestmark = pytest.mark.service

LIMIT = 100_000


@pytest.fixture(scope="module")
def small_broker(module_processes):
    return module_processes.service("zmqflow.services.broker", ["--max-message-bytes", str(LIMIT)])


def blob(n):
    return np.zeros(n, np.uint8)


def test_request_over_the_limit_is_answered_naming_limit_and_size(small_broker):
    with RpcClient(small_broker.endpoint) as client:
        with pytest.raises(InvalidArgumentError, match=r"message of 150\d\d\d bytes exceeds the limit of 100000 bytes "
                                                       r"\(max_message_bytes\)"):
            client.call("ping", tensors=[blob(150_000)], timeout=5)
        client.ping(timeout=5)  # still served: UnavailableError otherwise


def test_request_beyond_the_socket_cap_is_named_not_lost(small_broker):
    with RpcClient(small_broker.endpoint, heartbeat_interval=0.2) as client:
        # named from the heartbeat answers (a deadline run out would be UnavailableError instead)
        with pytest.raises(InvalidArgumentError, match=r"request ping of 1000\d\d\d bytes exceeds the limit of "
                                                       r"100000 bytes \(max_message_bytes\)"):
            client.call("ping", tensors=[blob(1_000_000)], timeout=5)
        with pytest.raises(InvalidArgumentError, match="exceeds the limit of 100000 bytes"):
            client.submit("ping", tensors=[blob(300_000)], timeout=5)  # refused before sending: submit raises
        assert client.call("ping", tensors=[blob(1000)], timeout=5)[0]["service"] == "queue-broker"
    with RpcClient(small_broker.endpoint) as other:
        other.ping(timeout=5)  # another client is served too
    assert small_broker.alive()


def test_every_service_enforces_its_own_limit():
    service = Service("tcp://127.0.0.1:*", limits=Limits(max_message_bytes=10_000))
    thread = threading.Thread(target=service.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        with RpcClient(service.endpoint) as client:
            with pytest.raises(InvalidArgumentError, match=r"message of 15\d\d\d bytes exceeds the limit of 10000"):
                client.call("info", tensors=[blob(15_000)], timeout=5)
            assert client.call("info", timeout=5)[0]["stats"]["bad_requests"] == 1
    finally:
        service.stop()
        thread.join(5)
