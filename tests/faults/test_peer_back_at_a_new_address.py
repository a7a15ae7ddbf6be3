"""Issue: in Kubernetes a restarted pod comes back under the same name with a new address. A client
connects to the address its peer's name resolved to (common/rpc/resolver.py), so once its heartbeats
declare the peer dead it looks the name up again before reconnecting: a real broker SIGKILLed at
one address and started again at another under the same name is used again within the back-off."""

import socket
import time

import pytest

from zmqflow.common.errors import DeadlineExceededError, UnavailableError
from zmqflow.common.rpc.resolver import Resolver
from zmqflow.common.rpc.client import RpcClient
from tests.support import free_port

pytestmark = pytest.mark.faults


class Directory:
    """getaddrinfo answering `broker` with whatever address it holds now (a cluster's DNS)."""

    def __init__(self, address):
        self.address, self.lookups = address, 0

    def __call__(self, host, port, type=0):
        self.lookups += 1
        if host != "broker":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (self.address, 0))]


def test_a_peer_restarted_at_a_new_address_is_found_under_its_name(processes):
    port = free_port()
    directory = Directory("127.0.0.1")
    first = processes.service("zmqflow.services.broker", bind=f"tcp://127.0.0.1:{port}")
    client = RpcClient(f"tcp://broker:{port}", heartbeat_interval=0.2, heartbeat_liveness=3, name="moved",
                       resolver=Resolver(getaddrinfo=directory))
    try:
        client.ping(timeout=2.0)
        assert client.endpoint == f"tcp://127.0.0.1:{port}"
        first.kill()
        directory.address = "127.0.0.2"                  # the pod is back elsewhere, under the same name
        processes.service("zmqflow.services.broker", bind=f"tcp://127.0.0.2:{port}")
        back, failures = time.monotonic(), 0
        while True:
            try:
                client.ping(timeout=0.5)
                break
            except (UnavailableError, DeadlineExceededError):
                failures += 1
                assert time.monotonic() - back < 10.0, "the broker at its new address was not used within 10 s"
        took = time.monotonic() - back
        print(f"\nbroker at its new address used {took:.2f} s after it was ready ({failures} failed calls, "
              f"{directory.lookups} lookups)")
        assert client.endpoint == f"tcp://127.0.0.2:{port}" and directory.lookups >= 2
        assert took < 5.0
    finally:
        client.close()
