"""What one peer may hold in a service is bounded (docs/security.md), attacked for real.

Real services on ephemeral loopback ports, stopped by PID; the attackers are raw TCP sockets speaking
ZMTP 3 (tests/support/zmtp.py): an unfinished message sent for ever, replies never read, a thousand
idle connections, twenty thousand parked requests. Each test asserts the bound (the service's memory,
its connection count, its CPU), the refusal (the exact error, the counter in `info`) and that a
legitimate client is still served.
"""

import json
import os
import socket
import struct
import time

import numpy as np
import pytest

from zmqflow.common.clients.ps import PsClient
from zmqflow.common.cluster.placement import place
from zmqflow.common.errors import DataLossError, InvalidArgumentError, ResourceExhaustedError
from zmqflow.common.rpc import admin_token
from zmqflow.common.rpc.client import RpcClient
from zmqflow.common.wire.frames import check_spec
from zmqflow.common.wire.protocol import VERSION
from zmqflow.inputs.formats.tfrecord import frame as tfrecord_frame, iter_records, masked_crc32c
from zmqflow.models.registry import load_model, model_variables
from zmqflow.models.spec import MNIST_MLP
from zmqflow.services.broker.queues.quota import default_max_total_bytes
from tests.support import zmtp

pytestmark = pytest.mark.service

TIMEOUT = 5.0
MiB = 1024 * 1024


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def info(endpoint):
    with RpcClient(endpoint) as client:
        return client.call("info", timeout=TIMEOUT)[0]


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s: {what}")


def closed_by_peer(sock):
    """Whether the service closed this connection (EOF or reset), waiting up to the socket's timeout."""
    try:
        while sock.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def test_an_unfinished_message_is_bounded_and_its_peer_dropped(processes):
    """Frames with MORE for ever: libzmq keeps them all (its pipes count whole messages) and none reaches
    the service; before the bound one such peer grew a broker by 2 GB in 3.5 s against a 1 MiB limit."""
    broker = processes.service("zmqflow.services.broker", ["--max-message-bytes", str(MiB)])
    before = rss(broker.pid)
    attacker = zmtp.connect(broker.endpoint, timeout=1.0)
    chunk = zmtp.frame(b"x" * 5000, more=True) * 64
    sent, started, dropped = 0, time.monotonic(), False
    while time.monotonic() - started < 4.0:
        try:
            attacker.sendall(chunk)
            sent += len(chunk)
        except (OSError, socket.timeout):
            dropped = True
            break
    peak = rss(broker.pid) - before
    attacker.close()
    assert dropped, f"the peer was never dropped ({sent / MiB:.0f} MiB sent)"
    assert peak < 200 * MiB, f"the broker grew by {peak / MiB:.0f} MiB"
    state = info(broker.endpoint)
    assert state["refused"]["unfinished_message"] == 1
    assert "an unfinished message holds" in broker.log() and "peer dropped" in broker.log()
    with RpcClient(broker.endpoint) as client:  # a whole message of up to twice the limit is still answered
        with pytest.raises(InvalidArgumentError, match="exceeds the limit of 1048576 bytes"):
            client.call("ping", tensors=[np.zeros(int(1.5 * MiB), np.uint8)], timeout=TIMEOUT)
        client.ping(timeout=TIMEOUT)
    assert info(broker.endpoint)["refused"]["unfinished_message"] == 1


def test_replies_a_client_never_reads_are_bounded(processes):
    """bf16 pulls (a 60-byte request, a 0.4 MB reply) from a peer that never reads: its requests are
    refused RESOURCE_EXHAUSTED past --max-unread-reply-bytes instead of queueing replies for ever."""
    spec, optimizer = json.dumps(MNIST_MLP), json.dumps({"kind": "sgd", "learning_rate": 0.1})
    ps = processes.service("zmqflow.services.ps", ["--task-index", "0", "--num-ps", "1", "--model", spec,
                                                   "--optimizer", optimizer, "--max-unread-reply-bytes", "8MiB"])
    legit = PsClient([ps.endpoint], place(model_variables(MNIST_MLP), 1))
    legit.initialize(load_model(MNIST_MLP).initial_values(1))
    legit.pull()
    before = rss(ps.pid)
    pulls = 400  # 160 MB of replies without the bound
    attacker = zmtp.connect(ps.endpoint, rcvbuf=4096)   # a job member (it has the token) that never reads
    token = admin_token.for_client(ps.endpoint, admin_token.JOB_TOKEN)
    attacker.sendall(b"".join(zmtp.request("pull", rid, {"bf16": True}, token=token) for rid in range(1, pulls + 1)))
    wait_for(lambda: info(ps.endpoint)["stats"]["requests"] >= pulls, 20, "the ps read every pull")
    grown = rss(ps.pid) - before
    state = info(ps.endpoint)
    assert state["refused"]["unread_replies"] > 0, state["refused"]
    assert grown < 64 * MiB, f"the ps grew by {grown / MiB:.0f} MiB for replies nobody reads"
    assert set(legit.pull()) == {v.name for v in model_variables(MNIST_MLP)}  # the legitimate client is served
    attacker.close()
    legit.close()


def test_connections_are_bounded_and_half_open_ones_time_out(processes):
    """1,100 raw TCP connections that never finish the handshake: the broker keeps at most
    --max-connections, closes the rest, stays responsive without spinning, and drops the idle ones
    after --handshake-timeout-secs. Before: they used up its descriptors and spun it at 97% CPU."""
    broker = processes.service("zmqflow.services.broker", ["--max-connections", "200", "--handshake-timeout-secs", "3"])
    attackers = []
    try:
        for _ in range(1100):
            sock = zmtp.connect(broker.endpoint, handshake=False, timeout=2.0)
            sock.send(b"\xff\x00")  # two bytes of a greeting, and then nothing
            attackers.append(sock)
        state = info(broker.endpoint)
        assert state["connections"] <= 200 and state["refused"]["connections"] >= 100, state
        cpu = cpu_seconds(broker.pid)
        started = time.monotonic()
        with RpcClient(broker.endpoint) as client:  # a legitimate client gets in (evicting an idle peer)
            client.ping(timeout=3.0)
            assert time.monotonic() - started < 3.0
            state = client.call("info", timeout=TIMEOUT)[0]
        assert state["connections"] <= 200
        time.sleep(1.0)
        assert cpu_seconds(broker.pid) - cpu < 0.6, "the broker spins"
        # the half-open peers are closed once the handshake timeout passes
        for sock in attackers:
            sock.settimeout(5.0)
        assert all(closed_by_peer(sock) for sock in attackers[-150:])
        assert info(broker.endpoint)["connections"] <= 2
    finally:
        for sock in attackers:
            sock.close()


def test_parked_requests_per_client_are_capped(processes):
    broker = processes.service("zmqflow.services.broker", ["--max-parked-per-client", "100"])
    with RpcClient(broker.endpoint) as client:
        handle = client.call("open_queue", {"declaration": {"kind": "FIFOQueue", "dtypes": ["int32"], "shapes": [[]],
                                                            "capacity": 10, "shared_name": "q"}},
                             timeout=TIMEOUT)[0]["handle"]
        parked = [client.submit("dequeue", {"queue": handle}, timeout=30) for _ in range(100)]
        wait_for(lambda: info(broker.endpoint)["parked"] == 100, 5, "100 dequeues parked")
        with pytest.raises(ResourceExhaustedError, match=r"this client has 100 requests waiting in queue-broker, "
                                                         r"the max_parked_per_client limit \(100\)"):
            client.call("dequeue", {"queue": handle}, timeout=TIMEOUT)
        client.ping(timeout=TIMEOUT)  # ping, cancel and bye are always answered
        with RpcClient(broker.endpoint) as other:  # another client is not held to this one's cap
            other.call("enqueue", {"queue": handle}, tensors=[np.int32(7)], timeout=TIMEOUT)
        assert parked[0].result()[1][0] == 7
        for call in parked[1:]:
            call.cancel()
        wait_for(lambda: info(broker.endpoint)["parked"] == 0, 5, "the parked dequeues cancelled")
        assert info(broker.endpoint)["refused"]["parked_requests"] == 1


def test_twenty_thousand_cancels_cost_linear_time(processes):
    """Each withdrawal is O(1): before, the queue scanned its waiting list (20,000 cancels: 3.8 s of CPU)."""
    broker = processes.service("zmqflow.services.broker", ["--max-parked-per-client", "20000"])
    n = 20_000
    with RpcClient(broker.endpoint) as client:
        handle = client.call("open_queue", {"declaration": {"kind": "FIFOQueue", "dtypes": ["int32"], "shapes": [[]],
                                                            "capacity": 10, "shared_name": "q"}},
                             timeout=TIMEOUT)[0]["handle"]
    attacker = zmtp.connect(broker.endpoint)   # a job member: dequeue needs the job token
    token = admin_token.for_client(broker.endpoint, admin_token.JOB_TOKEN)
    attacker.sendall(b"".join(zmtp.request("dequeue", rid, {"queue": handle}, token=token) for rid in range(1, n + 1)))
    wait_for(lambda: info(broker.endpoint)["parked"] == n, 20, f"{n} dequeues parked")
    cpu = cpu_seconds(broker.pid)
    cancels = b"".join(zmtp.request("cancel", n + rid, {"target": rid}) for rid in range(n, 0, -1))  # newest first
    attacker.sendall(cancels)
    wait_for(lambda: info(broker.endpoint)["parked"] == 0, 20, "every dequeue cancelled")
    spent = cpu_seconds(broker.pid) - cpu
    attacker.close()
    assert spent < 2.0, f"{n} cancels took {spent:.2f} s of CPU"
    with RpcClient(broker.endpoint) as client:
        assert client.call("size", {"queue": handle}, timeout=TIMEOUT)[0]["size"] == 0


def test_a_zero_size_tensor_with_huge_dims_is_invalid_argument(broker_process):
    broker = broker_process
    with pytest.raises(InvalidArgumentError, match=r"its non-zero dims make more elements than max_message_bytes"):
        check_spec(["float32", [0, 2 ** 62]])
    assert check_spec(["float32", [0, 784]]) == ("float32", (0, 784))
    attacker = zmtp.connect(broker.endpoint)
    header = {"v": VERSION, "op": "ping", "id": 9, "args": {}, "tensors": [["float32", [0, 2 ** 62]]]}
    attacker.sendall(zmtp.request(None, None, header=header))
    wait_for(lambda: info(broker.endpoint)["stats"]["bad_requests"] >= 1, 5, "the request refused")
    state = info(broker.endpoint)
    assert state["stats"]["bad_requests"] >= 1 and "internal error" not in broker.log(), state["stats"]
    attacker.close()


@pytest.mark.unit
def test_a_tfrecord_record_over_the_maximum_is_data_loss_before_it_is_read(tmp_path):
    path = tmp_path / "huge.tfrecord"
    length = struct.pack("<Q", 2 ** 60)  # a record claiming an exabyte, its length checksum right
    path.write_bytes(tfrecord_frame(b"ok") + length + struct.pack("<I", masked_crc32c(length)) + b"x" * 100)
    with pytest.raises(DataLossError, match=r"record at offset 18 of 1152921504606846976 bytes is over the "
                                            r"maximum record size \(268435456 bytes, max_record_bytes\)"):
        list(iter_records(str(path)))
    small = tmp_path / "small.tfrecord"
    small.write_bytes(tfrecord_frame(b"a" * 10) + tfrecord_frame(b"b" * 1000))
    assert len(list(iter_records(str(small)))) == 2
    with pytest.raises(DataLossError, match="of 1000 bytes is over the maximum record size"):
        list(iter_records(str(small), max_record_bytes=100))


@pytest.mark.unit
def test_the_brokers_default_quota_follows_the_cgroup_limit(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text(f"{512 * MiB}\n")
    assert default_max_total_bytes([str(v2)]) == (256 * MiB, f"half the cgroup memory limit {512 * MiB} ({v2})")
    v2.write_text("max\n")
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert default_max_total_bytes([str(v2), str(v1)])[0] == machine // 2
    v1.write_text("9223372036854771712\n")  # cgroup v1 without a limit
    assert default_max_total_bytes([str(tmp_path / "absent"), str(v1)])[0] == machine // 2
    v1.write_text(f"{256 * MiB}\n")
    assert default_max_total_bytes([str(tmp_path / "absent"), str(v1)])[0] == 128 * MiB


def test_the_broker_logs_how_its_default_quota_was_found(broker_process):
    total, derivation = default_max_total_bytes()
    assert f"--max-total-bytes {total}: {derivation}" in broker_process.log()
