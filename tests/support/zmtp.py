"""A raw ZMTP 3.1 peer over a plain TCP socket (NULL mechanism), for tests that attack a service as a
hand-written client could: frames with MORE for ever, requests whose replies are never read."""

import socket
import struct

from zmqflow.common.wire import frames as wire


def greeting():
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\0") + b"\0" + b"\0" * 31


def _command(name, body):
    data = bytes([len(name)]) + name + body
    return b"\x04" + bytes([len(data)]) + data


def ready(socket_type=b"DEALER"):
    return _command(b"READY", bytes([11]) + b"Socket-Type" + struct.pack(">I", len(socket_type)) + socket_type)


def frame(data, more):
    data = bytes(data)
    flags = 1 if more else 0
    size = bytes([flags, len(data)]) if len(data) < 256 else bytes([flags | 2]) + struct.pack(">Q", len(data))
    return size + data


def message(frames):
    return b"".join(frame(f, i < len(frames) - 1) for i, f in enumerate(frames))


def request(op, rid, args=None, header=None, token=None):
    """A whole request message as ZMTP bytes (`header`: a raw header dict instead of the usual one; `token`:
    the credential of the op's role, common/rpc/admin_token.py)."""
    frames = wire.request_frames(op, rid, args, token=token) if header is None else [wire.pack(header), b""]
    return message(frames)


def host_port(endpoint):
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return host, int(port)


def connect(endpoint, handshake=True, rcvbuf=None, timeout=5.0):
    """A TCP connection to a service, greeted as a DEALER when `handshake` (else it just sits there)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window it offers
    sock.settimeout(timeout)
    sock.connect(host_port(endpoint))
    if handshake:
        sock.sendall(greeting() + ready())
        _read_exactly(sock, 64)  # the service's greeting, then its READY: messages only after it (libzmq
        flags, size = _read_exactly(sock, 2)  # takes a frame that comes before for a handshake command)
        _read_exactly(sock, size if flags == 4 else struct.unpack(">Q", bytes([size]) + _read_exactly(sock, 7))[0])
    return sock


def _read_exactly(sock, n):
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise ConnectionError("the service closed the connection during the handshake")
        data += piece
    return data
