"""DEALER sockets to a service, built one way for every client (RpcClient, the aggregator's members).

Why one helper: each such socket needs the same settings to be safe (no linger at close, a
send that cannot block for ever, the frame size limit, CURVE when keys are given, a routing
id that names its owner); only the queue depth and the send timeout differ between owners.
The socket comes back unconnected, so its owner can attach a monitor before connecting.
"""

import struct
import uuid

import zmq

from zmqflow.common.rpc import encryption as curve
from zmqflow.common.rpc.resolver import is_ipv6


def dealer_socket(context, limits, name, curve_keys, hwm, send_timeout_ms):
    """A configured, not yet connected DEALER: `hwm` messages queued each way, a send that fails after
    `send_timeout_ms` (0: at once) instead of blocking, a CURVE client with `curve_keys` (or plain)."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.routing_id = f"{name}-{uuid.uuid4().hex[:12]}".encode()
    sock.setsockopt(zmq.MAXMSGSIZE, limits.socket_max_frame_bytes)
    sock.sndhwm = sock.rcvhwm = hwm
    sock.sndtimeo = send_timeout_ms
    curve.secure_client(sock, curve_keys)
    return sock


def connect_resolved(sock, endpoint):
    """Connect `sock` to an endpoint whose host is already an address (common/rpc/resolver.py): libzmq then
    has no name to look up in its I/O thread. An IPv6 address needs the socket's ipv6 option."""
    if is_ipv6(endpoint):
        sock.ipv6 = True
    sock.connect(endpoint)


def recv_monitor_message(socket):
    """One monitor event, {"event", "value", "endpoint"} as pyzmq's zmq.utils.monitor gives it (v1 format: a 16-bit
    event and a 32-bit value, then the endpoint), read here: that module imports zmq.asyncio, so asyncio, ~0.05 s
    of every service's start-up (bench startup)."""
    event, endpoint = socket.recv_multipart()
    number, value = struct.unpack("=hi", event[:6])
    return {"event": number, "value": value, "endpoint": endpoint}
