"""ZeroMQ calls from the event loop: one DEALER per upstream service, many requests in flight, none blocking another.

Why zmq.asyncio rather than the blocking clients in a thread pool: an HTTP request waiting for a
slow ensemble then costs a future, not a thread, so a stalled upstream cannot use up the threads
every other request needs. Replies are matched to their futures by request id (the wire's `id`),
as RpcClient does; a request whose deadline and grace pass is cancelled at the service and fails
with UNAVAILABLE naming the address. The socket connects to the address the host name resolves to
(common/resolver.py), never to the name, as every other client does.
"""

import asyncio
import itertools
import logging

import zmq
import zmq.asyncio

from zmqflow.common import curve, wire
from zmqflow.common.errors import UnavailableError, error_from_code
from zmqflow.common.limits import DEFAULT_LIMITS
from zmqflow.common.protocol import Ops
from zmqflow.common.resolver import default_resolver
from zmqflow.common.rpc_client import grace_for
from zmqflow.common.sockets import connect_resolved, dealer_socket

log = logging.getLogger(__name__)


class Upstream:
    """Calls to one ZeroMQ service (an aggregator or a model server) at `address`."""

    def __init__(self, address, context, limits=DEFAULT_LIMITS, resolver=default_resolver):
        self.address, self.limits, self.resolver = address, limits, resolver
        keys = curve.curve_dir_from_env()
        self.sock = dealer_socket(context, limits, "gateway", curve.ClientKeys(keys) if keys else None,
                                  hwm=100_000, send_timeout_ms=0)
        self.endpoint = None
        self.pending = {}   # request id -> future of (result, tensors)
        self._ids = itertools.count(1)
        self._reader = None

    async def call(self, op, args=None, tensors=(), timeout=10.0, grace=None):
        """(result dict, arrays) of `op`; the service's error as its OpError; UnavailableError when no
        answer comes within `timeout` seconds (the request's deadline at the service) and `grace` more
        (default: RpcClient's, so the service's own deadline answer arrives first)."""
        await self._connect(timeout)
        rid = next(self._ids)
        frames = wire.request_frames(op, rid, args, tensors, max(1, int(timeout * 1000)))
        future = asyncio.get_running_loop().create_future()
        self.pending[rid] = future
        try:
            await self.sock.send_multipart(frames)
            header, frames = await asyncio.wait_for(future, timeout + (grace_for(timeout) if grace is None else grace))
        except (asyncio.TimeoutError, zmq.ZMQError) as exc:
            self._cancel_at_service(rid)
            raise UnavailableError(f"no answer from {self.address} to {op} within {timeout:.3g} s and its grace"
                                   if isinstance(exc, asyncio.TimeoutError) else
                                   f"cannot send {op} to {self.address}: {exc}") from None
        finally:
            self.pending.pop(rid, None)  # also when the HTTP client went away (the task was cancelled)
        if header.get("code"):
            raise error_from_code(header["code"], header.get("error") or "")
        return header.get("result") or {}, wire.decode_tensors(header.get("tensors", []), frames, self.limits)

    async def _connect(self, timeout):
        if self.endpoint is not None:
            return
        endpoint = self.resolver.endpoint(self.address)
        if endpoint is None:  # the lookup runs in the resolver's thread: wait for it without blocking the loop
            endpoint = await asyncio.to_thread(self.resolver.wait, self.address, min(timeout, 5.0))
        if endpoint is None:
            reason = self.resolver.error(self.address) or "its lookup has not answered yet"
            raise UnavailableError(f"service at {self.address} is unavailable: its name does not resolve ({reason})")
        if self.endpoint is None:
            connect_resolved(self.sock, endpoint)
            self.endpoint = endpoint
            self._reader = asyncio.get_running_loop().create_task(self._read_replies())

    async def _read_replies(self):
        while True:
            try:
                frames = await self.sock.recv_multipart(copy=False)
            except (zmq.ZMQError, asyncio.CancelledError):
                return
            try:
                header = wire.unpack(frames[0].bytes, self.limits)
            except Exception as exc:  # a malformed reply is dropped, as RpcClient drops it
                log.warning("malformed reply from %s dropped: %s", self.address, exc)
                continue
            future = self.pending.get(header.get("id"))
            if future is not None and not future.done():
                future.set_result((header, frames[1:]))

    def _cancel_at_service(self, rid):
        try:
            sent = self.sock.send_multipart(wire.request_frames(Ops.CANCEL, next(self._ids), {"target": rid}))
        except zmq.ZMQError:
            return  # best effort: the service drops the request at its deadline anyway
        sent.add_done_callback(lambda done: done.cancelled() or done.exception())

    def close(self):
        if self._reader is not None:
            self._reader.cancel()
        self.sock.close(0)


class Upstreams:
    """The gateway's Upstream per address, made on first use and kept (members come and go, sockets stay cheap)."""

    def __init__(self, limits=DEFAULT_LIMITS):
        self.context = zmq.asyncio.Context()
        self.limits = limits
        self.by_address = {}

    def get(self, address):
        upstream = self.by_address.get(address)
        if upstream is None:
            upstream = self.by_address[address] = Upstream(address, self.context, self.limits)
        return upstream

    def close(self):
        for upstream in self.by_address.values():
            upstream.close()
        self.by_address.clear()
        self.context.term()
