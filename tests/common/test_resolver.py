"""The background resolver: never blocks the caller, caches with a TTL, backs off failed names,
looks up again on refresh (a restarted pod's new address), passes addresses and ipc:// through."""

import socket
import threading
import time

import pytest

from zmqflow.common.rpc.resolver import Resolver, is_ipv6, split_tcp
from tests.support import wait_for

pytestmark = pytest.mark.unit


class FakeDNS:
    """getaddrinfo with a table of answers (an address, or an exception), optionally held until released."""

    def __init__(self, answers, hold=False):
        self.answers, self.calls = dict(answers), []
        self.release = threading.Event()
        if not hold:
            self.release.set()

    def __call__(self, host, port, type=0):
        self.calls.append(host)
        self.release.wait(10)
        answer = self.answers[host]
        if isinstance(answer, Exception):
            raise answer
        family = socket.AF_INET6 if ":" in answer else socket.AF_INET
        return [(family, socket.SOCK_STREAM, 6, "", (answer, 0))]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_addresses_localhost_and_other_transports_pass_through_without_a_lookup():
    dns = FakeDNS({})
    resolver = Resolver(getaddrinfo=dns)
    for endpoint in ("tcp://10.0.0.5:5700", "tcp://localhost:5700", "ipc:///tmp/s", "inproc://x",
                     "tcp://[::1]:5700", "tcp://127.0.0.1:*"):
        assert resolver.endpoint(endpoint) == endpoint
    assert dns.calls == [] and split_tcp("tcp://serve1:5700") == ("serve1", "5700")


def test_a_slow_lookup_never_blocks_the_caller_and_wait_is_bounded():
    dns = FakeDNS({"serve1": "10.0.0.7"}, hold=True)
    resolver = Resolver(getaddrinfo=dns)
    start = time.monotonic()
    assert resolver.endpoint("tcp://serve1:5700") is None
    assert resolver.wait("tcp://serve1:5700", timeout=0.1) is None
    assert time.monotonic() - start < 0.5
    assert dns.calls == ["serve1"]                       # one lookup running, not one per ask
    dns.release.set()
    assert resolver.wait("tcp://serve1:5700", timeout=5) == "tcp://10.0.0.7:5700"
    assert resolver.endpoint("tcp://serve1:5701") == "tcp://10.0.0.7:5701"  # the host's answer, any port
    assert dns.calls == ["serve1"]


def test_answers_expire_after_the_ttl_and_refresh_looks_up_a_new_address():
    dns, clock = FakeDNS({"ps-1.ps": "10.0.0.1"}), Clock()
    resolver = Resolver(ttl_s=30, getaddrinfo=dns, clock=clock)
    assert resolver.wait("tcp://ps-1.ps:5600", 5) == "tcp://10.0.0.1:5600"
    dns.answers["ps-1.ps"] = "10.0.0.2"                  # the pod restarted with a new address
    clock.now += 10
    assert resolver.endpoint("tcp://ps-1.ps:5600") == "tcp://10.0.0.1:5600" and len(dns.calls) == 1  # cached
    clock.now += 25                                      # past the TTL: the old answer while looking up again
    assert resolver.endpoint("tcp://ps-1.ps:5600") == "tcp://10.0.0.1:5600"
    wait_for(lambda: resolver.endpoint("tcp://ps-1.ps:5600") == "tcp://10.0.0.2:5600", 5, "the new answer")
    assert len(dns.calls) == 2
    dns.answers["ps-1.ps"] = "10.0.0.3"
    resolver.refresh("tcp://ps-1.ps:5600")               # reconnecting: the old address is forgotten
    assert resolver.wait("tcp://ps-1.ps:5600", 5) == "tcp://10.0.0.3:5600"


def test_a_name_that_does_not_resolve_is_retried_after_a_bounded_back_off():
    dns, clock = FakeDNS({"gone": socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")}), Clock()
    resolver = Resolver(retry_start_s=0.25, retry_max_s=1.0, getaddrinfo=dns, clock=clock)
    assert resolver.wait("tcp://gone:5700", 5) is None
    assert "Temporary failure" in resolver.error("tcp://gone:5700")
    backoffs = []
    for _ in range(5):
        start = clock.now
        while resolver.wait("tcp://gone:5700", 5) is None and len(dns.calls) == len(backoffs) + 1:
            clock.now += 0.0625                          # asked often: no new lookup before the back-off ends
        backoffs.append(round(clock.now - start, 2))
    assert backoffs == [0.25, 0.5, 1.0, 1.0, 1.0]
    dns.answers["gone"] = "10.0.0.9"                     # back in DNS
    clock.now += 1.0
    assert resolver.wait("tcp://gone:5700", 5) == "tcp://10.0.0.9:5700" and resolver.error("tcp://gone:5700") is None


def test_ipv4_answers_are_preferred_and_an_ipv6_only_answer_is_bracketed():
    resolver = Resolver(getaddrinfo=FakeDNS({"v6": "fd00::5"}))
    endpoint = resolver.wait("tcp://v6:5700", 5)
    assert endpoint == "tcp://[fd00::5]:5700" and is_ipv6(endpoint)

    def both(host, port, type=0):
        return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::5", 0, 0, 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 0))]
    assert Resolver(getaddrinfo=both).wait("tcp://dual:5700", 5) == "tcp://10.0.0.5:5700"
