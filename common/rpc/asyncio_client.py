"""The asyncio driver of the RPC call core (common/rpc/calls.py): calls from an event loop, none blocking another.

Why on the event loop rather than the blocking client in a thread pool: an HTTP request waiting for a slow
ensemble then costs a future, not a thread, so a stalled service cannot use up the threads every other
request needs (the gateway). The loop's reader of each socket completes each call's future; a call whose
deadline and grace pass is cancelled at the service and fails UNAVAILABLE naming the address. No
heartbeats: a caller's deadline bounds every wait.
"""

import asyncio
import logging
import time

import zmq

from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import UnavailableError
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.rpc.resolver import default_resolver
from zmqflow.common.rpc.calls import Calls, client_socket
from zmqflow.common.rpc.sockets import connect_resolved

log = logging.getLogger(__name__)


class AsyncRpcClient:
    """Calls to the service at `address` from the running event loop (`context`: a zmq.Context, or a
    zmq.asyncio.Context whose libzmq context is used).

    Why a plain socket read by the loop's own reader (`add_reader` on its ZMQ_FD) rather than zmq.asyncio's
    sockets: each of those sends and receives goes through pyzmq's future and poller machinery; here a send is
    one non-blocking send and a reply completes its call's future straight from the reader. ZMQ_FD signals
    edges, so every send and every wake-up reads the socket until ZMQ_EVENTS says nothing more waits."""

    def __init__(self, address, context, limits=DEFAULT_LIMITS, resolver=default_resolver, name="client"):
        self.address, self.limits, self.resolver = address, limits, resolver
        self.calls = Calls(address, limits, resolver, writable=False)
        # a zmq.asyncio.Context (a test's) is shadowed: its sockets would be zmq.asyncio's
        self._context = context if type(context) is zmq.Context else zmq.Context.shadow(context.underlying)
        self.sock = client_socket(self._context, limits, name, hwm=100_000, send_timeout_ms=0)
        self._loop = None   # the loop whose reader watches the socket, once connected

    async def call(self, op, args=None, tensors=(), timeout=10.0, grace=None):
        """(result dict, arrays) of `op` (a declared request, or an op's name and `args`); the service's error
        as its OpError; UnavailableError when no answer comes within `timeout` seconds (the request's deadline
        at the service) and `grace` more (default: common/rpc/calls.py's, so the service's own answer comes first)."""
        await self._connect(timeout)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call, frames = self.calls.request(op, args, tensors, timeout, time.monotonic(), future, grace)
        try:
            wire.send_message(self.sock, frames)
        except zmq.ZMQError as exc:   # its queue is full (sndtimeo 0) or the socket is closed
            self.calls.give_up(call)
            raise UnavailableError(f"cannot send {call.op} to {self.address}: {exc}") from None
        self._drain()   # the send may have taken the descriptor's edge of a reply that waits
        timer = None if call.deadline is None else \
            loop.call_at(loop.time() + call.deadline - time.monotonic(), _wake, future)
        try:
            await future
        except asyncio.CancelledError:  # the caller went away (an HTTP client gone): withdraw it at the service
            self._send_quietly(self.calls.cancel(call))
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self.calls.pending.pop(call.id, None)  # also when the caller went away (its task was cancelled)
        if not call.done:   # woken by the timer: past the deadline and grace
            self._send_quietly(self.calls.give_up(call))
        if call.error is not None:
            raise call.error
        return call.value

    async def _connect(self, timeout):
        if self.calls.endpoint is not None:
            return
        if self.resolver.endpoint(self.address) is None:  # the lookup runs in the resolver's thread: wait off the loop
            await asyncio.to_thread(self.resolver.wait, self.address, min(timeout, 5.0))
        endpoint = self.calls.endpoint_to_connect()
        if endpoint is not None:
            connect_resolved(self.sock, endpoint)
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
                self._loop.add_reader(self.sock.FD, self._drain)
        elif self.calls.endpoint is None:  # (another call may have connected while this one waited)
            raise self.calls.unresolved()

    def _drain(self):
        """Every reply waiting, each completing its call's future (the checks are common/wire/frames.py's)."""
        sock, calls = self.sock, self.calls
        while not sock.closed and wire.readable(sock):
            try:
                _, header, frames, error = wire.recv_message(sock, False, self.limits, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            call = calls.received(header, frames, error)
            if call is not None and call.waiter is not None and not call.waiter.done():
                call.waiter.set_result(None)

    def _send_quietly(self, frames):
        """Best effort (a cancel): the service drops the request at its deadline anyway."""
        try:
            wire.send_message(self.sock, frames)
        except zmq.ZMQError:
            pass

    def close(self):
        if self._loop is not None and not self.sock.closed:
            self._loop.remove_reader(self.sock.FD)
            self._loop = None
        self.sock.close(0)


def _wake(future):
    """A call's deadline and grace passed: its caller wakes and gives it up."""
    if not future.done():
        future.set_result(None)


class AsyncClients:
    """One AsyncRpcClient per address, made on first use and kept (members come and go, sockets stay cheap)."""

    def __init__(self, limits=DEFAULT_LIMITS, name="client"):
        self.context = zmq.Context()
        self.limits, self.name = limits, name
        self.by_address = {}

    def get(self, address):
        client = self.by_address.get(address)
        if client is None:
            client = self.by_address[address] = AsyncRpcClient(address, self.context, self.limits, name=self.name)
        return client

    def close(self):
        for client in self.by_address.values():
            client.close()
        self.by_address.clear()
        self.context.term()
