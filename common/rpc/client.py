"""The blocking driver of the RPC call core (common/rpc/calls.py): one DEALER socket, many requests in flight.

`submit()` sends a request and returns a `PendingCall` at once; `call()` is submit + result. Waiting
pumps the socket: replies are matched by id, and while a reply is due the client pings the service
every `heartbeat_interval` seconds. A service silent for `heartbeat_liveness` intervals is reported as
UnavailableError naming its address, the socket is replaced, and the next attempt waits the core's
back-off. Silent: no ping answered, and no byte crossing the connection either. A ping's answer queues
behind the replies sent before it on the same connection, so over a slow link it may wait for a large pull
(13 MB over 100 Mbit/s shared by 4 workers: over 4 s); while the kernel says a reply's bytes are arriving
(TCP_INFO's bytes_received) or a request's are taken in (bytes_acked, more than a ping's), the service is
alive and busy, not lost. A stopped or dead service moves no bytes but what its kernel held already, so it is
still found within about `heartbeat_liveness` intervals of the last byte. After a loss, a service that
announces itself before the back-off ends (the new socket completes its handshake: the socket's monitor
says so) is retried at once. A request waits for the service's name to resolve within its own
timeout, and fails with UnavailableError if it does not; a service declared dead is looked up again.

One client belongs to one thread (ZeroMQ sockets are not thread-safe); use one client per thread.
With ZMQFLOW_CURVE_DIR set (or `curve_dir=`) it speaks CURVE and checks the service's key. Admin ops
carry the admin token (`admin_token=`), member ops the job token (`job_token=`), else the ones
common/rpc/admin_token.py's `for_client` finds.
"""

import time

import zmq

from zmqflow.common.rpc import encryption as curve
from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import UnavailableError
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.wire.protocol import Ops
from zmqflow.common.rpc.resolver import default_resolver
from zmqflow.common.rpc.calls import USE_DEFAULT, Call, Calls, client_socket
from zmqflow.common.rpc.connections import tcp_counts
from zmqflow.common.rpc.sockets import connect_resolved, recv_monitor_message

_MONITORED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
_REQUEST_MOVING_BYTES = 64 * 1024
"""Bytes of ours the service's host acknowledged between two looks that show it is taking a request in: fewer
may be our pings alone, which the kernel of a stopped process still acknowledges."""


class PendingCall(Call):
    """A request in flight; `result()` waits for its reply (`waiter`: its client)."""

    __slots__ = ()

    def result(self):
        """(result dict, list of arrays); raises the service's error as an OpError."""
        if not self.done:
            self.waiter._wait(self)
        if self.error is not None:
            raise self.error
        return self.value

    def wait(self, timeout):
        """Wait up to `timeout` s for the reply (pumping the socket); True once it is in."""
        if not self.done:
            self.waiter._wait(self, until=time.monotonic() + timeout)
        return self.done

    def cancel(self):
        """Ask the service to withdraw this request; a late success still arrives."""
        if not self.done:
            self.waiter._send(self.op, self.waiter.calls.cancel(self))


class RpcClient:
    def __init__(self, address, default_timeout=None, heartbeat_interval=1.0, heartbeat_liveness=3,
                 limits=DEFAULT_LIMITS, context=None, name="client", curve_dir=USE_DEFAULT, admin_token=USE_DEFAULT,
                 resolver=default_resolver, job_token=USE_DEFAULT):
        self.address = address
        self.default_timeout = default_timeout
        self.heartbeat_interval = heartbeat_interval
        self.heartbeat_liveness = heartbeat_liveness
        self.limits = limits
        self.context = context or zmq.Context.instance()
        self.name = name
        self.resolver = resolver
        self._curve_dir = curve.curve_dir_from_env() if curve_dir is USE_DEFAULT else curve_dir
        self.calls = Calls(address, limits, resolver, admin_token, job_token=job_token)
        self.calls.call_class = PendingCall
        self.socket = self._monitor = None
        self._connect()

    @property
    def endpoint(self):
        """The resolved address the socket is connected to (None while the name does not resolve)."""
        return self.calls.endpoint

    def _connect(self):
        self.socket = client_socket(self.context, self.limits, self.name, self._curve_dir, hwm=100_000,
                                    send_timeout_ms=int(self.heartbeat_interval * self.heartbeat_liveness * 1000))
        # the service announcing itself: a completed handshake ends a back-off at once; the connection's
        # descriptor, to ask the kernel whether bytes move while a ping's answer waits its turn
        self._monitor = self.socket.get_monitor_socket(_MONITORED)
        self._fd, self._traffic, self._moving_at = None, None, 0.0
        self._connect_resolved()
        self._poller = zmq.Poller()
        self._poller.register(self.socket, zmq.POLLIN)
        self._rcvtimeo = -1  # the socket's RCVTIMEO (ms), set only when a wait needs another
        self._last_heard = time.monotonic()
        self._last_ping = 0.0
        self._unanswered_since = None  # when the oldest ping still without any answer was sent

    def _connect_resolved(self):
        endpoint = self.calls.endpoint_to_connect()
        if endpoint is not None:
            connect_resolved(self.socket, endpoint)

    def _await_address(self, timeout):
        """Connect once the service's name resolves, waiting up to `timeout` s for its lookup; returns
        the time left of `timeout` (None: no deadline)."""
        if self.calls.endpoint is not None:
            return timeout
        started = time.monotonic()
        self.resolver.wait(self.address, timeout)
        self._connect_resolved()
        if self.calls.endpoint is None:
            raise self.calls.unresolved()
        return None if timeout is None else max(0.0, timeout - (time.monotonic() - started))

    # ------------------------------------------------ public

    def submit(self, op, args=None, tensors=(), timeout=USE_DEFAULT):
        """Send a request now: `op` a declared request (common/wire/protocol.py, its fields the args), or an
        op's name and its `args`; `timeout` (seconds, None = no deadline) becomes its deadline."""
        if timeout is USE_DEFAULT:
            timeout = self.default_timeout
        self._respect_backoff(timeout)
        timeout = self._await_address(timeout)
        now = time.monotonic()
        if not self.calls.pending:
            self._last_heard = now  # silence counts from when we start expecting an answer
        call, frames = self.calls.request(op, args, tensors, timeout, now, self)
        self._send(call.op, frames)
        return call

    def call(self, op, args=None, tensors=(), timeout=USE_DEFAULT):
        return self.submit(op, args, tensors, timeout).result()

    def poll(self, timeout):
        """Take in the replies that arrive within `timeout` s, without waiting for one call: for
        open-loop drivers that send on a schedule and collect in between. Calls past their
        deadline (and grace) are given up. Returns how many calls are still pending."""
        if self._poller.poll(max(0, int(timeout * 1000))):   # returns at once when a reply waits
            self._receive_all()
        for call in self.calls.overdue(time.monotonic()):
            self._give_up(call)
        return len(self.calls.pending)

    def ping(self, timeout=2.0):
        """Round-trip time in seconds to the service, or UnavailableError."""
        start = time.monotonic()
        self.call(Ops.Ping(), timeout=timeout)
        return time.monotonic() - start

    def close(self):
        """Tell the service we are leaving (it cancels our parked requests), then close."""
        if self.socket is None:
            return
        try:
            if self.calls.pending:
                self.socket.send(self.calls.bye()[0], zmq.NOBLOCK)
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

    def _respect_backoff(self, timeout):
        """Wait out the back-off, unless the service announces itself first (then retry now)."""
        wait = self.calls.retry_at - time.monotonic()
        if wait <= 0:
            return
        self._connect_resolved()  # looked up again meanwhile
        until = time.monotonic() + (wait if timeout is None else min(wait, timeout))
        while not self._watch_connection():
            left = until - time.monotonic()
            if left <= 0 or not self._monitor.poll(max(1, int(1000 * left))):
                break
        else:
            self.calls.announced()
            return
        if timeout is not None and wait > timeout:
            raise UnavailableError(f"service at {self.address} is unavailable; next attempt in {wait:.1f} s")

    def _send(self, op, frames):
        try:
            wire.send_message(self.socket, frames)
        except zmq.Again:  # no connection to queue on: the service refused our handshake, or is gone
            hint = " (is this client's CURVE key in the service's authorized/?)" if self._curve_dir else ""
            error = UnavailableError(f"service at {self.address} has no connection to send {op} on: it refused "
                                     f"this client's handshake{hint} or is gone")
            self._reconnect(lambda call: error, time.monotonic())
            raise error from None

    def _wait(self, call, until=None):
        while not call.done:
            now = time.monotonic()
            if until is not None and now >= until:
                return
            if call.deadline is not None and now >= call.deadline:
                self._give_up(call)
                return
            # dead = a ping unanswered for `liveness` intervals, and no byte moving meanwhile (a reply ahead of
            # the ping's answer arriving); silence alone is no proof, since this socket is not pumped while its
            # owner waits on another service or computes
            window = self.heartbeat_interval * self.heartbeat_liveness
            if self._unanswered_since is not None and self._silent_for(now) > window and \
                    self._silent_for(now, look=True) > window:
                self._receive_all()   # answers already here: this thread was held up (the GIL, the CPU), not the
                if self._unanswered_since is None:   # service, and their bytes moved while it could not look
                    continue
                silent = now - self._unanswered_since
                self._reconnect(lambda lost: UnavailableError(f"service at {self.address} did not answer for "
                                                              f"{silent:.1f} s (during {lost.op}, request {lost.id})"),
                                now)
                return
            if now - max(self._last_heard, self._last_ping) >= self.heartbeat_interval:
                try:
                    self._send(Ops.Ping.OP, self.calls.ping())
                except UnavailableError:
                    return  # every pending call failed with it
                self._last_ping = now
                if self._unanswered_since is None:
                    self._unanswered_since = now
                self._look_at_traffic(now)
            limit = min(self.heartbeat_interval, (call.deadline - now) if call.deadline else 1e9,
                        (until - now) if until is not None else 1e9)
            self._receive_within(max(1, int(limit * 1000)))

    def _receive_within(self, timeout_ms):
        """Take in one reply, waiting up to `timeout_ms` for it: a blocking receive under RCVTIMEO, as a plain
        DEALER's. A poll first, then a receive, asked the socket's mailbox three times more a reply (zmq_poll looks
        twice before it sleeps, and `readable` once after): each a poll(2) and getpid(2) on the caller's thread."""
        if timeout_ms != self._rcvtimeo:
            self.socket.rcvtimeo = self._rcvtimeo = timeout_ms
        try:
            _, header, frames, error = wire.recv_message(self.socket, False, self.limits)
        except zmq.Again:
            return
        self._heard(header, frames, error)

    def _receive_all(self):
        """The replies waiting, read until none is (a poll that said one does needs no ask before the first)."""
        while True:
            try:   # NOBLOCK all the same: a wait here would be a hang
                _, header, frames, error = wire.recv_message(self.socket, False, self.limits, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            self._heard(header, frames, error)
            if not wire.readable(self.socket):
                return

    def _heard(self, header, frames, error):
        self._last_heard = time.monotonic()
        self._unanswered_since = None
        self.calls.received(header, frames, error)

    def _silent_for(self, now, look=False):
        """Seconds since the oldest unanswered ping, or since bytes last moved if later (`look`: ask the
        kernel now)."""
        if look:
            self._look_at_traffic(now)
        return now - max(self._unanswered_since, self._moving_at)

    def _look_at_traffic(self, now):
        """Ask the kernel what crossed the connection since the last look (TCP only; nothing to say on
        ipc://): bytes of a reply received, or more than a ping's of a request acknowledged, mark it moving."""
        self._watch_connection()
        counts = tcp_counts(self._fd) if self._fd is not None else None
        last = self._traffic
        self._traffic = None if counts is None else (self._fd, counts[0], counts[1])
        if self._traffic and last and last[0] == self._fd and \
                (self._traffic[2] > last[2] or self._traffic[1] > last[1] + _REQUEST_MOVING_BYTES):
            self._moving_at = now

    def _watch_connection(self):
        """Take in the monitor's events: the descriptor of the connection (libzmq's, read only to ask the
        kernel about it); True when the service completed a handshake among them."""
        announced = False
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                announced = True
            elif event["event"] == zmq.EVENT_CONNECTED:
                self._fd = event["value"]
            elif event["value"] == self._fd:
                self._fd = None
        return announced

    def _give_up(self, call):
        self._send(call.op, self.calls.give_up(call))

    def _reconnect(self, error_of, now):
        """The service is gone: fail what is in flight with `error_of(call)`, and start over on a new socket."""
        self.calls.lost(error_of, now)
        self._close_socket()
        self._connect()


class OpClient:
    """Base of the typed clients (ModelClient, AggregatorClient): one RpcClient, closed with them."""

    def __init__(self, address, timeout=None, name="client", **rpc_options):
        self.address = address
        self.rpc = RpcClient(address, default_timeout=timeout, name=name, **rpc_options)

    def info(self, timeout=5.0):
        """The service's info: service, task, pid, uptime_s, metrics, ... (every service answers it)."""
        return self.rpc.call(Ops.Info(), timeout=timeout)[0]

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
