"""Issue: after a long outage a client's back-off reached 32 s, so a service that came back was not
used for up to 32 s. The back-off is capped at 2 s, and a service that announces itself (the client's
socket completes a handshake with it) is retried at once: a real broker killed, its client failing
for 8 s, the broker started again on the same port and used within 2 s."""

import time

import pytest

from zmqflow.common.errors import DeadlineExceededError, UnavailableError
from zmqflow.common.rpc.calls import BACKOFF_MAX
from zmqflow.common.rpc.client import RpcClient
from tests.support import free_port

pytestmark = pytest.mark.faults


def test_a_service_back_after_a_long_outage_is_used_within_two_seconds(processes):
    bind = f"tcp://127.0.0.1:{free_port()}"
    broker = processes.service("zmqflow.services.broker", bind=bind)
    client = RpcClient(broker.endpoint, heartbeat_interval=0.2, heartbeat_liveness=3, name="outage")
    try:
        client.ping(timeout=2.0)
        broker.kill()
        failures, outage_end = 0, time.monotonic() + 8.0
        while time.monotonic() < outage_end:      # the client keeps failing: its back-off grows to the cap
            try:
                client.ping(timeout=0.5)
            except (UnavailableError, DeadlineExceededError):
                failures += 1
        assert failures >= 4 and client.calls.backoff == BACKOFF_MAX == 2.0
        processes.service("zmqflow.services.broker", bind=bind)
        back = time.monotonic()
        while True:
            try:
                client.ping(timeout=0.5)
                break
            except (UnavailableError, DeadlineExceededError):
                assert time.monotonic() - back < 5.0, "the restarted broker was not used within 5 s"
        took = time.monotonic() - back
        print(f"\nrestarted broker used {took:.2f} s after it was ready ({failures} failed calls in the outage)")
        assert took <= 2.0
    finally:
        client.close()
