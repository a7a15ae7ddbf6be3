"""Members named by host name: a name that does not resolve leaves its member unhealthy ("name does
not resolve") while the others answer, and once it resolves the member is connected to its address
and taken back by a probe; the members list shows the name and the address."""

import socket
import threading

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.rpc.resolver import Resolver
from zmqflow.services.aggregator.server import Aggregator
from tests.support import wait_for

pytestmark = pytest.mark.service


class Directory:
    """getaddrinfo knowing the names in `names` (name -> address); the others do not resolve."""

    def __init__(self):
        self.names = {}

    def __call__(self, host, port, type=0):
        if host not in self.names:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (self.names[host], 0))]


def test_a_member_is_taken_back_once_its_name_resolves_and_it_answers(fakes):
    live, named = fakes(2)
    port = named.endpoint.rsplit(":", 1)[1]
    directory = Directory()
    resolver = Resolver(getaddrinfo=directory, retry_start_s=0.05, retry_max_s=0.1)
    agg = Aggregator("tcp://127.0.0.1:*", members=[(live.endpoint, 1.0), (f"serve-b:{port}", 1.0)],
                     deadline_ms=1000, probe_ms=100, resolver=resolver)
    thread = threading.Thread(target=agg.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    x = np.ones((2, 4), np.float32)
    try:
        with AggregatorClient(agg.endpoint, timeout=5.0) as client:
            def member_b():
                return next(m for m in client.members() if m["address"] == f"tcp://serve-b:{port}")
            wait_for(lambda: "Name or service not known" in (member_b()["last_failure"] or ""), 5,
                     "the failed lookup to be reported")
            state = member_b()
            assert not state["healthy"] and state["last_failure"].startswith("name does not resolve")
            assert state["connected_to"] is None and state["requests"] == 0
            _, info = client.predict(x)
            assert info["answered"] == [live.endpoint]

            directory.names["serve-b"] = "127.0.0.1"    # back in DNS
            wait_for(lambda: member_b()["healthy"], 5, "serve-b to be taken back")
            assert member_b()["connected_to"] == f"tcp://127.0.0.1:{port}"
            probs, info = client.predict(x)
            assert sorted(info["answered"]) == sorted([live.endpoint, f"tcp://serve-b:{port}"])
            np.testing.assert_allclose(probs, 1.5)       # the mean of offsets 0 and 1 over x = 1
            client.remove_member(f"tcp://serve-b:{port}")
    finally:
        agg.stop()
        thread.join(5)
    assert not thread.is_alive()
