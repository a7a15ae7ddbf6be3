"""A member whose host name takes seconds to fail to resolve, for real: the aggregator's host has a
DNS server that never answers (a silent UDP listener on another host, named in the resolv.conf that
`ip netns exec` mounts over /etc/resolv.conf from /etc/netns/<namespace>/), as Compose's embedded
DNS behaves for a killed container when its upstream is unreachable. The two other members, model
servers on hosts of their own, keep answering every request within the deadline, and the
aggregator's ping stays fast. Needs root: it skips with the reason otherwise (`make test-netns`).
"""

import json
import os
import shutil
import sys

import pytest

from zmqflow.bench.serve import write_random_checkpoint
from tests.support import wait_for
from tests.support.netns import ZMQFLOW, NetworkNamespaces, skip_unless_usable

pytestmark = [pytest.mark.integration, pytest.mark.netns]

HOSTS = ["serve0", "serve1", "aggregator", "dns"]
SERVE_PORT, AGGREGATOR_PORT = 5700, 5800
GONE = "serve-gone"
DNS_TIMEOUT_S = 3
DEADLINE_MS, REQUESTS = 500, 200
# the services listen beyond loopback without CURVE (protected mode refuses that unless told): only these
# namespaces reach them
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "ZMQFLOW_INSECURE": "1"}

SILENT_DNS = """
import socket
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("0.0.0.0", 53))
print("listening", flush=True)
while True:
    server.recv(4096)   # every query read, none answered
"""

LOOKUP = """
import socket, sys, time
start = time.monotonic()
try:
    socket.getaddrinfo(sys.argv[1], 5700)
except OSError as error:
    print(f"{time.monotonic() - start:.2f} {error}")
"""

CLIENT = """
import json, sys, time
import numpy as np
from zmqflow.common.clients.aggregator import AggregatorClient
members, x = sys.argv[2].split(","), np.random.default_rng(0).random((2, 784), dtype=np.float32)
latencies, both = [], 0
with AggregatorClient(sys.argv[1], timeout=10.0) as client:
    for _ in range(int(sys.argv[3])):
        start = time.monotonic()
        probs, info = client.predict(x, deadline_ms=int(sys.argv[4]))
        latencies.append(time.monotonic() - start)
        both += sorted(info["answered"]) == sorted(members)
    pings = [client.rpc.ping(timeout=5.0) for _ in range(20)]
    states = client.members()
print(json.dumps({"latencies": latencies, "both": both, "pings": pings, "members": states}))
"""


@pytest.fixture(scope="module")
def network():
    skip_unless_usable()
    with NetworkNamespaces(HOSTS) as hosts:
        etc = f"/etc/netns/{hosts.namespace('aggregator')}"
        made_parent = not os.path.isdir("/etc/netns")
        os.makedirs(etc, exist_ok=True)
        try:
            with open(f"{etc}/resolv.conf", "w") as f:
                f.write(f"nameserver {hosts.address('dns')}\noptions timeout:{DNS_TIMEOUT_S} attempts:1\n")
            yield hosts
        finally:
            shutil.rmtree(etc, ignore_errors=True)
            if made_parent:
                os.rmdir("/etc/netns")
    assert not hosts.leftovers(), f"left behind: {hosts.leftovers()}"


def start_ready(processes, network, host, name, argv, log_dir):
    """A zmqflow service in the host's namespace, once it serves (its --ready-file)."""
    ready = os.path.join(log_dir, f"{name}.ready")
    child = processes.start(name, network.run(host, [ZMQFLOW, *argv, "--ready-file", ready]),
                            env=ENV, log_path=os.path.join(log_dir, f"{name}.log"))
    wait_for(lambda: os.path.exists(ready) or not child.alive(), 30, f"{name} to serve")
    assert child.alive(), f"{name} exited with {child.returncode}:\n{child.log()[-3000:]}"
    return child


def test_a_member_whose_name_lookup_times_out_stalls_nobody(network, processes, tmp_path):
    logs = str(tmp_path)
    dns = processes.start("dns", network.run("dns", [sys.executable, "-c", SILENT_DNS]), env=ENV,
                          log_path=os.path.join(logs, "dns.log"))
    wait_for(lambda: "listening" in dns.log() or not dns.alive(), 10, "the silent DNS server to listen")
    lookup = network.execute("aggregator", [sys.executable, "-c", LOOKUP, GONE], timeout=60)
    took = float(lookup.stdout.split()[0])
    print(f"\nlooking up {GONE} on the aggregator's host: {lookup.stdout.strip()}")
    assert took >= DNS_TIMEOUT_S - 0.5, lookup.stdout + lookup.stderr  # the fault is real: seconds per lookup

    members = []
    for i in range(2):
        ckpt = str(tmp_path / f"ckpt{i}")
        write_random_checkpoint(ckpt, i + 1)
        start_ready(processes, network, f"serve{i}", f"serve{i}",
                    ["serve", "--checkpoint", ckpt, "--backend", "numpy", "--max-delay-secs", "0.001",
                     "--bind", f"tcp://0.0.0.0:{SERVE_PORT}"], logs)
        members.append(f"tcp://{network.address(f'serve{i}')}:{SERVE_PORT}")
    start_ready(processes, network, "aggregator", "aggregator",
                ["aggregator", "--bind", f"tcp://0.0.0.0:{AGGREGATOR_PORT}", "--member", members[0],
                 "--member", members[1], "--member", f"{GONE}:{SERVE_PORT}", "--deadline-ms", str(DEADLINE_MS),
                 "--probe-every-secs", "0.2"], logs)
    client = network.execute("aggregator", [sys.executable, "-c", CLIENT, f"tcp://127.0.0.1:{AGGREGATOR_PORT}",
                                            ",".join(members), str(REQUESTS), str(DEADLINE_MS)], timeout=120)
    assert client.returncode == 0, client.stdout + client.stderr
    result = json.loads(client.stdout.strip().splitlines()[-1])
    latencies, pings = sorted(result["latencies"]), result["pings"]
    gone = next(m for m in result["members"] if m["address"] == f"tcp://{GONE}:{SERVE_PORT}")
    print(f"{result['both']}/{REQUESTS} answered by both live members; latency p50 "
          f"{latencies[len(latencies) // 2] * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms "
          f"(deadline {DEADLINE_MS} ms); ping max {max(pings) * 1000:.1f} ms; {GONE}: {gone['last_failure']}")
    assert result["both"] == REQUESTS
    assert latencies[-1] < DEADLINE_MS / 1000.0
    assert max(pings) < 0.25
    assert not gone["healthy"] and gone["last_failure"].startswith("name does not resolve")
