"""The asyncio driver of the RPC call core (common/rpc/calls.py): calls from an event loop, none blocking another.

Why zmq.asyncio rather than the blocking client in a thread pool: an HTTP request waiting for a slow
ensemble then costs a future, not a thread, so a stalled service cannot use up the threads every other
request needs (the gateway). One reader task per socket completes each call's future; a call whose
deadline and grace pass is cancelled at the service and fails UNAVAILABLE naming the address. No
heartbeats: a caller's deadline bounds every wait.
"""

import asyncio
import logging
import time

import zmq
import zmq.asyncio

from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import UnavailableError
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.rpc.resolver import default_resolver
from zmqflow.common.rpc.calls import Calls, client_socket
from zmqflow.common.rpc.sockets import connect_resolved

log = logging.getLogger(__name__)


class AsyncRpcClient:
    """Calls to the service at `address` from the running event loop (`context`: a zmq.asyncio.Context)."""

    def __init__(self, address, context, limits=DEFAULT_LIMITS, resolver=default_resolver, name="client"):
        self.address, self.limits, self.resolver = address, limits, resolver
        self.calls = Calls(address, limits, resolver, writable=False)
        self.sock = client_socket(context, limits, name, hwm=100_000, send_timeout_ms=0)
        self._reader = None

    async def call(self, op, args=None, tensors=(), timeout=10.0, grace=None):
        """(result dict, arrays) of `op` (a declared request, or an op's name and `args`); the service's error
        as its OpError; UnavailableError when no answer comes within `timeout` seconds (the request's deadline
        at the service) and `grace` more (default: common/rpc/calls.py's, so the service's own answer comes first)."""
        await self._connect(timeout)
        future = asyncio.get_running_loop().create_future()
        call, frames = self.calls.request(op, args, tensors, timeout, time.monotonic(), future, grace)
        try:
            await self.sock.send_multipart(frames)
            await asyncio.wait_for(future, call.deadline - time.monotonic())
        except asyncio.TimeoutError:
            self._send_quietly(self.calls.give_up(call))
        except asyncio.CancelledError:  # the caller went away (an HTTP client gone): withdraw it at the service
            self._send_quietly(self.calls.cancel(call))
            raise
        except zmq.ZMQError as exc:
            self._send_quietly(self.calls.give_up(call))
            raise UnavailableError(f"cannot send {call.op} to {self.address}: {exc}") from None
        finally:
            self.calls.pending.pop(call.id, None)  # also when the caller went away (its task was cancelled)
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
            self._reader = asyncio.get_running_loop().create_task(self._read_replies())
        elif self.calls.endpoint is None:  # (another call may have connected while this one waited)
            raise self.calls.unresolved()

    async def _read_replies(self):
        while True:
            try:
                frames = await self.sock.recv_multipart(copy=False)
            except (zmq.ZMQError, asyncio.CancelledError):
                return
            header, error = None, None
            try:
                header = wire.unpack(frames[0].bytes, self.limits)
            except Exception as exc:
                error = exc
            call = self.calls.received(header, frames[1:], error)
            if call is not None and not call.waiter.done():
                call.waiter.set_result(None)

    def _send_quietly(self, frames):
        """Best effort (a cancel): the service drops the request at its deadline anyway."""
        try:
            sent = self.sock.send_multipart(frames)
        except zmq.ZMQError:
            return
        sent.add_done_callback(lambda done: done.cancelled() or done.exception())

    def close(self):
        if self._reader is not None:
            self._reader.cancel()
        self.sock.close(0)


class AsyncClients:
    """One AsyncRpcClient per address, made on first use and kept (members come and go, sockets stay cheap)."""

    def __init__(self, limits=DEFAULT_LIMITS, name="client"):
        self.context = zmq.asyncio.Context()
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
