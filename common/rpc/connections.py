"""What each peer of a service's ROUTER socket may hold: connections, unfinished messages, unread replies.

libzmq bounds none of these. Its pipes count whole messages, so a peer that sends frames with MORE for
ever is never counted: its unfinished message grows the service until memory runs out (2 GB in 3.5 s
from one raw TCP peer against a 1 MiB limit), and no frame of it ever reaches the application. A
ROUTER queues replies for a peer that never reads up to SNDHWM messages, whatever their size. And it
accepts peers until the process has no descriptor left, then its listener spins on EMFILE.

The socket monitor names each connection's descriptor (accepted, disconnected), the kernel knows what
crossed it (TCP_INFO's bytes_received and bytes_acked), and the service counts what it read from and
sent to it in ZMTP's wire bytes (`zmtp_bytes`); the differences are what libzmq holds for that peer.
A peer over a bound is dropped by shutdown(2) of its connection, which libzmq takes for the peer
closing: its pipe and what it held go. A connection that is not TCP (ipc://) is counted, not measured.
"""

import logging
import resource
import socket
import struct
import time
from fcntl import ioctl
from termios import FIONREAD

from zmqflow.common.wire.frames import zmtp_bytes

log = logging.getLogger(__name__)

_TCP_INFO_LEN = 232
_BYTES_ACKED_RECEIVED = struct.Struct("=QQ")  # tcp_info's tcpi_bytes_acked, tcpi_bytes_received (Linux >= 4.1)
_BYTES_AT = 120
_SLACK = 1024 * 1024  # the handshake and what the I/O thread decodes while the bytes are read
_REPLY_CHECK_MIN_BYTES = 1024 * 1024  # the kernel is asked about a peer's unread replies at most once per MiB sent
_LOG_EVERY_S = 10.0
_CHECK_EVERY_S = 0.1


def raise_descriptor_limit():
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (what a service may use); the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft


class Connection:
    __slots__ = ("fd", "accepted", "read", "sent", "next_check", "unread", "over_at")

    def __init__(self, fd, now, check_every):
        self.fd, self.accepted = fd, now
        self.read = 0           # wire bytes of the messages the service read from it
        self.sent = 0           # wire bytes of the replies the service sent on it
        self.next_check = check_every   # `sent` at which the kernel is asked next
        self.unread = 0         # reply bytes its peer had not acknowledged at the last look
        self.over_at = None     # `read` when its unfinished message was last seen over the bound


class Connections:
    """The ROUTER's connections by descriptor, and the bounds on each (see the module docstring).

    `max_connections`: past it a new peer evicts the oldest one that never sent a message (an idle or
    half-open peer), else it is dropped itself. `max_pending_bytes`: what an unfinished message may hold.
    `max_unread_reply_bytes`: past it the peer's requests are refused until it reads (`congested`)."""

    def __init__(self, max_connections, max_pending_bytes, max_unread_reply_bytes, curve=False, name="service"):
        limit = raise_descriptor_limit()
        if max_connections > (limit - 64) // 2:
            log.warning("%s: %d connections asked, but RLIMIT_NOFILE is %d: at most %d", name, max_connections,
                        limit, max(1, (limit - 64) // 2))
            max_connections = max(1, (limit - 64) // 2)
        self.max_connections, self.max_pending_bytes = max_connections, max_pending_bytes
        self.max_unread_reply_bytes, self.name = max_unread_reply_bytes, name
        # between two looks a peer may leave 1/16 of the bound more unread (each look costs ~10 us, a syscall
        # pair: once per MiB was 4 us a 314 KB batch), besides the look every 0.1 s (`check`)
        self.reply_check_bytes = max(_REPLY_CHECK_MIN_BYTES, max_unread_reply_bytes // 16)
        self._pad = zmtp_bytes(0, curve) - zmtp_bytes(0)  # CURVE's box around each frame
        self.open = {}  # fd -> Connection, oldest first
        self.refused = {"connections": 0, "unfinished_message": 0, "unread_replies": 0, "parked_requests": 0}
        self._logged = {}
        self._next_check = 0.0
        self.trim_due = False  # a dropped peer's unfinished message was freed: the heap goes back (common/memory.py)

    def __len__(self):
        return len(self.open)

    def accepted(self, fd, now):
        """A new connection: kept, or one (an idle one, else this) dropped when over max_connections."""
        self.open[fd] = Connection(fd, now, self.reply_check_bytes)
        if len(self.open) <= self.max_connections:
            return
        idle = next((c for c in self.open.values() if c.read == 0 and c.fd != fd), None)
        victim = idle or self.open[fd]
        self._drop(victim, "connections", f"over --max-connections ({self.max_connections}): the "
                   + ("oldest connection that sent nothing yet" if idle else "new connection") + " is closed")

    def closed(self, fd):
        self.open.pop(fd, None)

    def received(self, fd, nbytes):
        """The service read a message of `nbytes` wire bytes from connection `fd`: its Connection (None: not
        counted, e.g. its accept is not read yet)."""
        conn = self.open.get(fd)
        if conn is not None:
            conn.read += nbytes
        return conn

    def sent(self, fd, frames):
        """A reply of `frames` went to connection `fd`: counted; the kernel is asked every reply_check_bytes."""
        conn = self.open.get(fd)
        if conn is None:
            return
        pad, sent = self._pad, conn.sent
        for frame in frames:  # zmtp_bytes, inlined: this runs for every reply
            n = len(frame) + pad
            sent += n + 2 if n < 256 else n + 9
        conn.sent = sent
        if sent >= conn.next_check:
            self._measure_unread(conn)

    def congested(self, conn):
        """The replies the peer on `conn` leaves unread when more than max_unread_reply_bytes (measured now),
        else 0."""
        if conn.unread <= self.max_unread_reply_bytes or self.open.get(conn.fd) is not conn:
            return 0
        self._measure_unread(conn)
        if conn.unread <= self.max_unread_reply_bytes:
            return 0
        self.refused["unread_replies"] += 1
        return conn.unread

    def check(self, now, socket_readable):
        """Every 0.1 s: drop a peer whose unfinished message holds more than max_pending_bytes (nothing of
        it was read since it was last seen over, or no whole message waits: so it is one unfinished
        message, not requests the loop has yet to read), and update the unread replies."""
        if now < self._next_check:
            return
        self._next_check = now + _CHECK_EVERY_S
        for conn in list(self.open.values()):
            counts = tcp_counts(conn.fd)
            if counts is None:
                continue
            acked, received, waiting = counts
            conn.unread = max(0, conn.sent - acked)
            pending = received - waiting - conn.read
            if pending <= self.max_pending_bytes + _SLACK:
                conn.over_at = None
            elif conn.over_at == conn.read or not socket_readable():
                self.trim_due = True
                self._drop(conn, "unfinished_message", f"an unfinished message holds {pending} bytes, over "
                           f"twice --max-message-bytes ({self.max_pending_bytes})")
            else:
                conn.over_at = conn.read

    def _measure_unread(self, conn):
        counts = tcp_counts(conn.fd)
        conn.next_check = conn.sent + self.reply_check_bytes
        if counts is not None:
            conn.unread = max(0, conn.sent - counts[0])

    def _drop(self, conn, reason, why):
        """Close a peer's connection under libzmq (it sees the peer close); counted and logged, not too often."""
        self.refused[reason] += 1
        now = time.monotonic()
        if now >= self._logged.get(reason, 0.0):
            log.warning("%s: peer dropped (%d so far for this reason): %s", self.name, self.refused[reason], why)
            self._logged[reason] = now + _LOG_EVERY_S
        self.open.pop(conn.fd, None)
        _shutdown(conn.fd)


def tcp_counts(fd):
    """(bytes acked by the peer, bytes received from it, bytes received not yet read) of a TCP connection,
    or None (not TCP, or closed)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        waiting = struct.unpack("i", ioctl(fd, FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return None
    finally:
        sock.detach()
    if len(info) < _BYTES_AT + _BYTES_ACKED_RECEIVED.size:
        return None
    acked, received = _BYTES_ACKED_RECEIVED.unpack_from(info, _BYTES_AT)
    return acked, received, waiting


def _shutdown(fd):
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return  # gone already
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()
