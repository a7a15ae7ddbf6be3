"""Issue: one dead member whose host name stops resolving froze the whole aggregator (0 of 500 requests
answered in containers): libzmq looks a name up in its I/O thread on every reconnect, and a lookup
that takes seconds (a gone container or pod, an unreachable DNS server) blocks every socket of that
context. Names are now resolved in the background (common/rpc/resolver.py) and sockets connect to the
address. Here the lookup of one name takes 3 s and fails, as with a DNS server that never answers
(a getaddrinfo shim, tests/support/slow_names.py), in the aggregator with two real members, and in
a process whose RpcClient to that name shares its context with a client of a live broker."""

import json
import os
import sys
import time

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from tests.aggregator.fakes import FakeMember
from tests.support import wait_for
from tests.support.slow_names import slow_names_env

pytestmark = pytest.mark.faults

GONE = "serve-gone"
LOOKUP_S = 3.0
DEADLINE_MS = 500
REQUESTS = 60


@pytest.fixture
def members():
    made = [FakeMember(offset=float(i)).start() for i in range(2)]
    yield made
    for member in made:
        member.shutdown()


def test_a_member_whose_name_lookup_hangs_stalls_nobody(processes, members, tmp_path):
    env = slow_names_env([GONE], LOOKUP_S, tmp_path)
    agg = processes.service("zmqflow.services.aggregator",
                            ["--member", members[0].endpoint, "--member", members[1].endpoint,
                             "--member", f"{GONE}:5700", "--deadline-ms", str(DEADLINE_MS), "--probe-every-secs", "0.2"],
                            env=env)
    x = np.ones((2, 4), np.float32)
    with AggregatorClient(agg.endpoint, timeout=5.0) as client:
        latencies, answered = [], 0
        for _ in range(REQUESTS):
            start = time.monotonic()
            probs, info = client.predict(x, deadline_ms=DEADLINE_MS)
            latencies.append(time.monotonic() - start)
            answered += sorted(info["answered"]) == sorted(m.endpoint for m in members)
            np.testing.assert_allclose(probs, 1.5)  # the mean of the two live members (offsets 0 and 1)
        pings = [client.rpc.ping(timeout=2.0) for _ in range(20)]
        gone = next(m for m in client.members() if m["address"] == f"tcp://{GONE}:5700")
    print(f"\n{answered}/{REQUESTS} answered by both live members; latency p50 "
          f"{np.median(latencies) * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms (deadline {DEADLINE_MS} ms); "
          f"ping max {max(pings) * 1000:.1f} ms; gone member: {gone['last_failure']}")
    assert answered == REQUESTS
    assert max(latencies) < DEADLINE_MS / 1000.0
    assert max(pings) < 0.25
    assert not gone["healthy"] and gone["last_failure"].startswith("name does not resolve")
    assert gone["connected_to"] is None and gone["requests"] == 0  # never asked, so nobody waited on it


CLIENTS = """
import json, sys, threading, time
from zmqflow.common.errors import UnavailableError
from zmqflow.common.rpc.client import RpcClient

live = RpcClient(sys.argv[1], name="live")      # both on the process's shared context
live.ping(timeout=2.0)
failed = {}

def call_the_gone_peer():
    gone = RpcClient(sys.argv[2], name="gone")
    start = time.monotonic()
    try:
        gone.ping(timeout=1.0)
    except UnavailableError as error:
        failed.update(after_s=time.monotonic() - start, error=str(error))
    gone.close()

thread = threading.Thread(target=call_the_gone_peer)
thread.start()
pings, end = [], time.monotonic() + float(sys.argv[3])
while time.monotonic() < end:
    pings.append(live.ping(timeout=5.0))
    time.sleep(0.02)
thread.join(10)
live.close()
print(json.dumps({"pings": pings, **failed}))
"""


def test_a_client_of_a_name_that_hangs_fails_in_time_and_delays_no_other_client(processes, tmp_path):
    broker = processes.service("zmqflow.services.broker")
    env = slow_names_env([GONE], LOOKUP_S, tmp_path)
    child = processes.start("clients", [sys.executable, "-c", CLIENTS, broker.endpoint, f"tcp://{GONE}:5555",
                                        str(LOOKUP_S + 0.5)], env={**os.environ, **env},
                            log_path=str(tmp_path / "clients.log"))
    wait_for(lambda: not child.alive(), LOOKUP_S + 20, "the clients to finish")
    assert child.returncode == 0, child.log()[-3000:]
    result = json.loads(child.log().strip().splitlines()[-1])
    pings = result["pings"]
    print(f"\nthe gone peer's call failed after {result.get('after_s', -1):.2f} s (timeout 1 s): "
          f"{result.get('error')}; {len(pings)} pings of the live broker meanwhile, max {max(pings) * 1000:.1f} ms")
    assert "does not resolve" in result["error"] and result["after_s"] < 1.5
    assert max(pings) < 0.25
