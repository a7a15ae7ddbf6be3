"""The client side of the RPC base: one DEALER socket, many requests in flight.

`submit()` sends a request and returns a `PendingCall` at once; `call()` is
submit + result. Waiting pumps the socket: replies are matched by id (a reply
nobody waits for any more is dropped), and while a reply is due the client
pings the service every `heartbeat_interval` seconds. A service silent for
`heartbeat_liveness` intervals is reported as UnavailableError naming its
address, the socket is replaced, and the next attempt waits a back-off of
0.25 s doubling to 2 s (the zguide's Paranoid Pirate, with a cap short enough
that a service back after a long outage is used within 2 s); a service that
announces itself sooner (the new socket completes its handshake: the socket's
monitor says so) is retried at once.

The socket connects to the address the service's host name resolves to (common/resolver.py),
never to the name: libzmq would look it up in the I/O thread of the context, which other
clients and the process's own service share, and a name whose lookup takes seconds (a peer
gone from DNS while it restarts) would stall them all. A request waits for the lookup within
its own timeout, and fails with UnavailableError if the name does not resolve; a service
declared dead is looked up again before the reconnect (a restarted pod has a new address).

Deadlines are the service's to enforce: the client sends `timeout` as the
request's deadline and waits a grace period longer for the answer, so an
element is never handed to a client that stopped waiting.

One client belongs to one thread (ZeroMQ sockets are not thread-safe); use one
client per thread. With ZMQFLOW_CURVE_DIR set (or `curve_dir=`) it speaks CURVE
and checks the service's key (common/curve.py). A request over the service's
max_message_bytes (learnt from ping answers) is refused with InvalidArgument.
Admin ops (common/protocol.py's ADMIN_OPS) carry the admin token (`admin_token=`, else
common/admin_token.py's `for_client`: the environment, the launcher's, or the service's file).
"""

import itertools
import logging
import time

import zmq

from zmqflow.common import admin_token as tokens
from zmqflow.common import curve, wire
from zmqflow.common.errors import InvalidArgumentError, UnavailableError, error_from_code
from zmqflow.common.limits import DEFAULT_LIMITS
from zmqflow.common.protocol import ADMIN_OPS, Ops
from zmqflow.common.resolver import default_resolver
from zmqflow.common.sockets import connect_resolved, dealer_socket

log = logging.getLogger(__name__)

USE_DEFAULT = object()
BACKOFF_START, BACKOFF_MAX = 0.25, 2.0


def grace_for(timeout):
    """How much longer than its deadline a client waits for the service's answer."""
    return 1.0 + 0.1 * timeout


class PendingCall:
    """A request in flight; `result()` waits for its reply."""

    __slots__ = ("client", "id", "op", "deadline", "done", "value", "error", "size")

    def __init__(self, client, rid, op, deadline, size=0):
        self.client, self.id, self.op, self.deadline, self.size = client, rid, op, deadline, size
        self.done, self.value, self.error = False, None, None

    def result(self):
        """(result dict, list of arrays); raises the service's error as an OpError."""
        if not self.done:
            self.client._wait(self)
        if self.error is not None:
            raise self.error
        return self.value

    def wait(self, timeout):
        """Wait up to `timeout` s for the reply (pumping the socket); True once it is in."""
        if not self.done:
            self.client._wait(self, until=time.monotonic() + timeout)
        return self.done

    def cancel(self):
        """Ask the service to withdraw this request; a late success still arrives."""
        if not self.done:
            self.client._send(Ops.CANCEL, {"target": self.id}, (), None, track=False)


class RpcClient:
    def __init__(self, address, default_timeout=None, heartbeat_interval=1.0, heartbeat_liveness=3,
                 limits=DEFAULT_LIMITS, context=None, name="client", curve_dir=USE_DEFAULT, admin_token=USE_DEFAULT,
                 resolver=default_resolver):
        self.address = address
        self.default_timeout = default_timeout
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_liveness = heartbeat_liveness
        self.limits = limits
        self.context = context or zmq.Context.instance()
        self.name = name
        self.resolver = resolver
        curve_dir = curve.curve_dir_from_env() if curve_dir is USE_DEFAULT else curve_dir
        self._curve = curve.ClientKeys(curve_dir) if curve_dir else None  # verify the service's key
        self._admin_token = admin_token  # USE_DEFAULT: looked up at each admin op (a restarted service makes a new one)
        self.service_max_bytes = None  # the service's request size limit, told by its ping answers
        self._ids = itertools.count(1)
        self._pending = {}
        self._pings = set()
        self._backoff = BACKOFF_START
        self._retry_at = 0.0
        self.socket = self._monitor = None
        self._connect()

    def _connect(self):
        self.socket = dealer_socket(self.context, self.limits, self.name, self._curve, hwm=100_000,
                                    send_timeout_ms=int(self.heartbeat_interval * self.heartbeat_liveness * 1000))
        # the service announcing itself: a completed handshake ends a back-off at once
        self._monitor = self.socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.endpoint = None  # the resolved address the socket is connected to
        self._connect_resolved(self.resolver.endpoint(self.address))
        self._poller = zmq.Poller()
        self._poller.register(self.socket, zmq.POLLIN)
        self._last_heard = time.monotonic()
        self._last_ping = 0.0
        self._unanswered_since = None  # when the oldest ping still without any answer was sent

    def _connect_resolved(self, endpoint):
        if endpoint is not None and self.endpoint is None:
            connect_resolved(self.socket, endpoint)
            self.endpoint = endpoint

    def _await_address(self, timeout):
        """Connect once the service's name resolves, waiting up to `timeout` s for its lookup; returns
        the time left of `timeout` (None: no deadline)."""
        if self.endpoint is not None:
            return timeout
        started = time.monotonic()
        self._connect_resolved(self.resolver.wait(self.address, timeout))
        if self.endpoint is None:
            reason = self.resolver.error(self.address) or "its lookup has not answered yet"
            raise UnavailableError(f"service at {self.address} is unavailable: its name does not resolve ({reason})")
        return None if timeout is None else max(0.0, timeout - (time.monotonic() - started))

    # ------------------------------------------------ public

    def submit(self, op, args=None, tensors=(), timeout=USE_DEFAULT):
        """Send a request now; `timeout` (seconds, None = no deadline) becomes its deadline."""
        if timeout is USE_DEFAULT:
            timeout = self.default_timeout
        self._respect_backoff(timeout)
        timeout = self._await_address(timeout)
        return self._send(op, args, tensors, timeout, track=True)

    def call(self, op, args=None, tensors=(), timeout=USE_DEFAULT):
        return self.submit(op, args, tensors, timeout).result()

    def poll(self, timeout):
        """Take in the replies that arrive within `timeout` s, without waiting for one call: for
        open-loop drivers that send on a schedule and collect in between. Calls past their
        deadline (and grace) are given up. Returns how many calls are still pending."""
        if wire.readable(self.socket) or self._poller.poll(max(0, int(timeout * 1000))):
            self._receive_all()
        now = time.monotonic()
        for pending in [p for p in self._pending.values() if p.deadline is not None and now >= p.deadline]:
            self._give_up(pending)
        return len(self._pending)

    def ping(self, timeout=2.0):
        """Round-trip time in seconds to the service, or UnavailableError."""
        start = time.monotonic()
        self.call(Ops.PING, {"ids": []}, timeout=timeout)
        return time.monotonic() - start

    def close(self):
        """Tell the service we are leaving (it cancels our parked requests), then close."""
        if self.socket is None:
            return
        try:
            if self._pending:
                self.socket.send(wire.pack({"v": wire.VERSION, "op": Ops.BYE, "id": 0, "deadline_ms": None,
                                            "args": {}, "tensors": []}), zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        self._close_socket(linger=100)

    def _close_socket(self, linger=0):
        if self._monitor is not None:
            self.socket.disable_monitor()
            self._monitor.close(0)
            self._monitor = None
        self.socket.close(linger=linger)
        self.socket = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------ internals

    def _token(self):
        """The admin token to send, or None (a CURVE client needs none: its key is its credential)."""
        return tokens.for_client(self.address) if self._admin_token is USE_DEFAULT else self._admin_token

    def _respect_backoff(self, timeout):
        """Wait out the back-off, unless the service announces itself first (then retry now)."""
        wait = self._retry_at - time.monotonic()
        if wait <= 0:
            return
        self._connect_resolved(self.resolver.endpoint(self.address))  # looked up again meanwhile
        if self._monitor.poll(int(1000 * (wait if timeout is None else min(wait, timeout)))):
            while self._monitor.poll(0):
                self._monitor.recv_multipart()
            self._retry_at, self._backoff = 0.0, BACKOFF_START
            return
        if timeout is not None and wait > timeout:
            raise UnavailableError(f"service at {self.address} is unavailable; next attempt in {wait:.1f} s")

    def _send(self, op, args, tensors, timeout, track):
        rid = next(self._ids)
        deadline_ms = None if timeout is None else max(0, int(timeout * 1000))
        token = self._token() if op in ADMIN_OPS else None
        frames = wire.request_frames(op, rid, args, tensors, deadline_ms, token)
        size = sum(map(len, frames)) if tensors else len(frames[0])
        if self.service_max_bytes is not None and size > self.service_max_bytes:  # it would be refused: say so now
            raise self._oversize(op, size)
        try:
            wire.send_message(self.socket, frames)
        except zmq.Again:  # no connection to queue on: the service refused our handshake, or is gone
            raise self._unreachable(op) from None
        if not track:
            return rid
        now = time.monotonic()
        if not self._pending:
            self._last_heard = now  # silence counts from when we start expecting an answer
        deadline = None if timeout is None else now + timeout + grace_for(timeout)
        pending = PendingCall(self, rid, op, deadline, size)
        self._pending[rid] = pending
        return pending

    def _wait(self, pending, until=None):
        while not pending.done:
            now = time.monotonic()
            if until is not None and now >= until:
                return
            if pending.deadline is not None and now >= pending.deadline:
                self._give_up(pending)
                return
            # dead = a ping unanswered for `liveness` intervals; silence alone is no proof, since this
            # socket is not pumped while its owner waits on another service or computes
            if self._unanswered_since is not None and \
                    now - self._unanswered_since > self.heartbeat_interval * self.heartbeat_liveness:
                self._declare_dead(now)
                return
            if now - max(self._last_heard, self._last_ping) >= self.heartbeat_interval:
                try:
                    self._pings.add(self._send(Ops.PING, {"ids": list(self._pending)}, (), None, track=False))
                except UnavailableError:
                    return  # every pending call failed with it
                self._last_ping = now
                if self._unanswered_since is None:
                    self._unanswered_since = now
            limit = min(self.heartbeat_interval, (pending.deadline - now) if pending.deadline else 1e9,
                        (until - now) if until is not None else 1e9)
            if wire.readable(self.socket) or self._poller.poll(max(1, int(limit * 1000))):
                self._receive_all()

    def _receive_all(self):
        while wire.readable(self.socket):
            _, header, frames, error = wire.recv_message(self.socket, False, self.limits)
            self._last_heard = time.monotonic()
            self._unanswered_since = None
            self._backoff = BACKOFF_START
            if error is not None or header is None:
                log.warning("malformed reply from %s dropped: %s", self.address, error)
                continue
            rid = header.get("id")
            if rid in self._pings:
                self._pings.discard(rid)
                result = header.get("result") or {}
                if type(result.get("max_message_bytes")) is int:
                    self.service_max_bytes = result["max_message_bytes"]
                self._forget_unknown(result.get("unknown", []))
                continue
            pending = self._pending.pop(rid, None)
            if pending is None:
                continue  # a late reply to a request we gave up on, or a ping answer
            self._complete(pending, header, frames)

    def _complete(self, pending, header, frames):
        pending.done = True
        code = header.get("code", 0)
        if code:
            pending.error = error_from_code(code, header.get("error") or "", header.get("details"))
            return
        try:
            tensors = wire.decode_tensors(header.get("tensors", []), frames, self.limits, writable=True)
            pending.value = (header.get("result") or {}, tensors)
        except Exception as exc:
            pending.error = exc

    def _forget_unknown(self, ids):
        """The service no longer holds these requests and their replies never came (a reconnect lost them)."""
        for rid in ids:
            pending = self._pending.pop(rid, None)
            if pending is not None and not pending.done:
                pending.done = True
                if self.service_max_bytes is not None and pending.size > self.service_max_bytes:  # dropped unread
                    pending.error = self._oversize(pending.op, pending.size)
                    continue
                pending.error = UnavailableError(
                    f"service at {self.address} lost request {rid} ({pending.op}); the connection was interrupted")

    def _oversize(self, op, size):
        return InvalidArgumentError(f"request {op} of {size} bytes exceeds the limit of {self.service_max_bytes} "
                                    f"bytes (max_message_bytes) of the service at {self.address}")

    def _give_up(self, pending):
        self._pending.pop(pending.id, None)
        pending.cancel()
        pending.done = True
        pending.error = UnavailableError(
            f"no answer from {self.address} to {pending.op} (request {pending.id}) within its deadline and grace")

    def _unreachable(self, op):
        """Fail every pending call and reconnect: sending found no connection (e.g. a CURVE key refused)."""
        hint = " (is this client's CURVE key in the service's authorized/?)" if self._curve else ""
        error = UnavailableError(f"service at {self.address} has no connection to send {op} on: it refused this "
                                 f"client's handshake{hint} or is gone")
        for pending in self._pending.values():
            pending.done, pending.error = True, error
        self._pending.clear()
        self._pings.clear()
        self._close_socket()
        self.resolver.refresh(self.address)  # a restarted peer may be back under a new address
        self._connect()
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)
        return error

    def _declare_dead(self, now):
        silent = now - self._unanswered_since
        for rid, pending in list(self._pending.items()):
            pending.done = True
            pending.error = UnavailableError(f"service at {self.address} did not answer for {silent:.1f} s "
                                             f"(during {pending.op}, request {rid})")
        self._pending.clear()
        self._pings.clear()
        self._close_socket()
        self.resolver.refresh(self.address)  # a restarted peer may be back under a new address
        self._connect()
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, BACKOFF_MAX)


class OpClient:
    """Base of the typed clients (ModelClient, AggregatorClient): one RpcClient, closed with them."""

    def __init__(self, address, timeout=None, name="client", **rpc_options):
        self.address = address
        self.rpc = RpcClient(address, default_timeout=timeout, name=name, **rpc_options)

    def info(self, timeout=5.0):
        """The service's info: service, task, pid, uptime_s, metrics, ... (every service answers it)."""
        return self.rpc.call(Ops.INFO, timeout=timeout)[0]

    def close(self):
        self.rpc.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ClientPool:
    """One RpcClient per (thread, address): ZeroMQ sockets must stay in their thread."""

    def __init__(self, **client_options):
        import threading
        self._local = threading.local()
        self._options = client_options

    def get(self, address):
        clients = self._local.__dict__.setdefault("clients", {})
        client = clients.get(address)
        if client is None:
            client = clients[address] = RpcClient(address, **self._options)
        return client

    def close_thread(self):
        """Close this thread's clients (their parked requests are cancelled)."""
        for client in self._local.__dict__.pop("clients", {}).values():
            client.close()


default_pool = ClientPool()
