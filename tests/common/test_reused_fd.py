"""A closed connection's disconnect event is never taken for a new client that reuses its fd number.

The service records the fd each client's messages came on (SRCFD) and cancels the parked requests on
an fd its socket monitor reports closed. A client that connects after an earlier one closed usually gets
the same fd number; when its request was read before the earlier close's event, the event cancelled
the new, live client's requests (a CI run's predict got "client disconnected"). Here the service's loop
is driven by hand to read in that order, over real sockets: the new request must stay parked."""

import time

import pytest
import zmq

from zmqflow.common.wire import frames as wire
from zmqflow.common.wire.protocol import BrokerOps
from zmqflow.services.broker.server import BrokerService
from zmqflow.common.rpc import admin_token

pytestmark = pytest.mark.service


def send(sock, op, args, rid):
    """A request as a job's member sends it (the job's token: this test run's)."""
    token = admin_token.from_environment(admin_token.JOB_TOKEN)
    wire.send_message(sock, wire.request_frames(op, rid, args, token=token))


def handle_one(service):
    assert service.socket.poll(5000), "no request reached the service"
    service._drain()


def dealer(context, endpoint, name):
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.routing_id = name
    sock.connect(endpoint)
    return sock


def test_a_new_client_on_a_reused_fd_keeps_its_parked_request():
    context = zmq.Context()
    service = BrokerService("tcp://127.0.0.1:0", context=context)
    try:
        opener = dealer(context, service.endpoint, b"opener")
        send(opener, BrokerOps.OpenQueue.OP, {"declaration": {"kind": "FIFOQueue", "capacity": 10, "dtypes": ["int32"],
                                                            "shapes": [[]], "shared_name": "q"}}, 1)
        handle_one(service)
        handle = wire.unpack(opener.recv_multipart()[0])["result"]["handle"]
        for attempt in range(10):   # until the kernel hands the new connection the closed one's fd number
            old = dealer(context, service.endpoint, f"old-{attempt}".encode())
            send(old, "size", {"queue": handle}, 1)
            handle_one(service)
            old_fd = service._fd_of[f"old-{attempt}".encode()]
            old.close()
            assert service._monitor.poll(5000), "the monitor did not report the closed connection"
            new = dealer(context, service.endpoint, f"new-{attempt}".encode())
            send(new, "dequeue", {"queue": handle}, 2)   # parks: the queue is empty
            handle_one(service)     # the new request first, then (as the loop polls) the monitor's event
            service._watch_connections()
            new_fd = service._fd_of.get(f"new-{attempt}".encode())
            parked = [c for c in service.parked.values() if c.identity == f"new-{attempt}".encode()]
            new.close()
            if new_fd == old_fd:
                break
            time.sleep(0.05)
        else:
            pytest.fail("no new connection reused the closed one's fd in 10 tries")
        print(f"\nfd {old_fd} closed, then reused by a new client: its dequeue is parked: {bool(parked)}")
        assert parked, "the closed connection's event cancelled the new client's request"
    finally:
        service.close()
        context.destroy(0)
