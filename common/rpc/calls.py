"""The client side of the RPC protocol without I/O: what a call to one service is, whoever drives it.

`Calls` keeps request ids, the calls in flight and their deadlines (the service's deadline plus a grace,
so the service's own DEADLINE_EXCEEDED arrives first and an element is never handed to a client that
stopped waiting), builds the frames of requests, cancels, pings and bye, takes in replies (one nobody
waits for any more is dropped; a ping's answer says which calls the service lost), gives up calls past
their deadline and grace, and keeps the back-off after a lost service (0.25 s doubling to 2 s, the
zguide's Paranoid Pirate). Like h11 it never touches a socket or a clock: drivers pass `now` and move
the frames. The drivers: `RpcClient` (blocking, common/rpc/client.py), `AsyncRpcClient` (asyncio,
common/rpc/asyncio_client.py) and `LoopClient` (a service's own loop, common/rpc/service.py). Each connects a
DEALER (CURVE when ZMQFLOW_CURVE_DIR is set) to the address the service's name resolves to
(common/rpc/resolver.py), never to the name: libzmq would look it up in the I/O thread other sockets share.
"""

import itertools
import logging

from zmqflow.common.rpc import admin_token as tokens
from zmqflow.common.rpc import encryption as curve
from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import (PERMISSION_DENIED, UNAUTHENTICATED, InvalidArgumentError, UnavailableError,
                                   error_from_code)
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.wire.protocol import ADMIN, MEMBER, ROLE_OF, Ops, Request
from zmqflow.common.rpc.resolver import default_resolver
from zmqflow.common.rpc.sockets import dealer_socket

log = logging.getLogger(__name__)

USE_DEFAULT = object()
BACKOFF_START, BACKOFF_MAX = 0.25, 2.0


def grace_for(timeout):
    """How much longer than its deadline a client waits for the service's answer."""
    return 1.0 + 0.1 * timeout


def client_socket(context, limits, name, curve_dir=USE_DEFAULT, hwm=100_000, send_timeout_ms=0):
    """A driver's DEALER, not connected yet: CURVE with the keys of `curve_dir` (default: ZMQFLOW_CURVE_DIR)."""
    curve_dir = curve.curve_dir_from_env() if curve_dir is USE_DEFAULT else curve_dir
    return dealer_socket(context, limits, name, curve.ClientKeys(curve_dir) if curve_dir else None, hwm,
                         send_timeout_ms)


class Call:
    """A request in flight: `done` once answered, then `value` ((result dict, arrays)) or `error`.
    `waiter` is the driver's (an asyncio future, a service's callback)."""

    __slots__ = ("id", "op", "deadline", "size", "done", "value", "error", "waiter")

    def __init__(self, rid, op, deadline, size, waiter=None):
        self.id, self.op, self.deadline, self.size, self.waiter = rid, op, deadline, size, waiter
        self.done, self.value, self.error = False, None, None

    def finish(self, value=None, error=None):
        self.done, self.value, self.error = True, value, error


class Calls:
    """The calls to the service at `address` (its name looked up with `resolver`); a driver may make them
    instances of its own `call_class` (a Call with its way of waiting)."""

    call_class = Call

    def __init__(self, address, limits=DEFAULT_LIMITS, resolver=default_resolver, admin_token=USE_DEFAULT,
                 decode=True, writable=True, job_token=USE_DEFAULT):
        self.address, self.limits, self.resolver = address, limits, resolver
        # a reply's tensors: decoded (`writable`: copied where the frame is read-only), or left as frames (`decode`
        # False) for an owner that checks them itself
        self.decode, self.writable = decode, writable
        # each guarded role's token: given, or (USE_DEFAULT) looked up once and again after a refusal (a restarted
        # service makes a new one), so a member op's token costs a dict lookup, not a file read
        self._given_tokens = {ADMIN: admin_token, MEMBER: job_token}
        self._tokens = {}
        self.service_max_bytes = None  # the service's request size limit, told by its ping answers
        self.pending = {}
        self.pings = set()
        self.late_replies = 0
        self.endpoint = None  # the resolved address the driver's socket is connected to
        self.backoff, self.retry_at = BACKOFF_START, 0.0
        self._ids = itertools.count(1)

    # ------------------------------------------------ the service's address

    def endpoint_to_connect(self):
        """The service's resolved address when the driver's socket should connect to it now (once), else None."""
        if self.endpoint is None:
            self.endpoint = self.resolver.endpoint(self.address)
            return self.endpoint

    def unresolved(self):
        reason = self.resolver.error(self.address) or "its lookup has not answered yet"
        return UnavailableError(f"service at {self.address} is unavailable: its name does not resolve ({reason})")

    # ------------------------------------------------ requests

    def request(self, op, args, tensors, timeout, now, waiter=None, grace=None, rid=None, encoded=None):
        """(the Call, its frames): `op` a declared request or an op's name with `args`; `timeout` (s, None: no
        deadline) is the service's deadline, the call's is `grace` later (default `grace_for`). Refused now if over
        the service's limit. `rid`: the caller's own request id (unique among its calls in flight). `encoded`:
        the same request's `encode` by another Calls (a fan-out encodes once for every member)."""
        rid, frames, size = encoded or self.encode(op, args, tensors, timeout, rid)
        op = op.OP if isinstance(op, Request) else op
        if encoded is not None:
            self._check_size(op, size)
        deadline = None if timeout is None else now + timeout + (grace_for(timeout) if grace is None else grace)
        call = self.pending[rid] = self.call_class(rid, op, deadline, size, waiter)
        return call, frames

    def encode(self, op, args, tensors, timeout, rid=None):
        """(request id, frames, bytes) of a request; refused now if over the service's limit."""
        if isinstance(op, Request):
            op, args = op.OP, op.encode()
        rid = next(self._ids) if rid is None else rid
        deadline_ms = None if timeout is None else max(0, int(timeout * 1000))
        role = ROLE_OF.get(op)
        token = self._token(role) if role in self._given_tokens else None
        frames = wire.request_frames(op, rid, args, tensors, deadline_ms, token)
        size = sum(map(len, frames)) if tensors else len(frames[0])
        self._check_size(op, size)
        return rid, frames, size

    def _check_size(self, op, size):
        if self.service_max_bytes is not None and size > self.service_max_bytes:  # it would be refused: say so now
            raise self._oversize(op, size)

    def _token(self, role):
        """The token of `role` to send, or None (a CURVE client needs none: its key is its credential)."""
        token = self._tokens.get(role, USE_DEFAULT)
        if token is USE_DEFAULT:
            given = self._given_tokens[role]
            token = self._tokens[role] = tokens.for_client(self.address, tokens.FOR_ROLE[role]) \
                if given is USE_DEFAULT else given
        return token

    def cancel(self, call):
        """The frames asking the service to withdraw `call` (a late success still arrives, and is dropped)."""
        return self.encode(Ops.Cancel.OP, {"target": call.id}, (), None)[1]

    def ping(self):
        """The frames of a ping asking which of our calls in flight the service no longer holds."""
        rid, frames, _ = self.encode(Ops.Ping.OP, {"ids": list(self.pending)}, (), None)
        self.pings.add(rid)
        return frames

    @staticmethod
    def bye():
        return [wire.pack({"v": wire.VERSION, "op": Ops.Bye.OP, "id": 0, "deadline_ms": None, "args": {},
                           "tensors": []})]

    # ------------------------------------------------ replies

    def received(self, header, frames, error=None):
        """Take in one reply (common/wire/frames.py's recv_message parts): the Call it completed, or None (a ping's
        answer, a late reply to a call given up, a malformed reply)."""
        self.backoff = BACKOFF_START
        if error is not None or header is None:
            log.warning("malformed reply from %s dropped: %s", self.address, error)
            return None
        rid = header.get("id")
        if rid in self.pings:
            self.pings.discard(rid)
            result = header.get("result") or {}
            if type(result.get("max_message_bytes")) is int:
                self.service_max_bytes = result["max_message_bytes"]
            for lost in [self.pending.pop(rid) for rid in result.get("unknown", []) if rid in self.pending]:
                # the service no longer holds it and its reply never came (a reconnect lost it), or dropped it unread
                oversize = self.service_max_bytes is not None and lost.size > self.service_max_bytes
                lost.finish(error=self._oversize(lost.op, lost.size) if oversize else UnavailableError(
                    f"service at {self.address} lost request {lost.id} ({lost.op}); the connection was interrupted"))
            return None
        call = self.pending.pop(rid, None)
        if call is None:
            self.late_replies += 1
            return None
        code = header.get("code", 0)
        if code:
            if code in (UNAUTHENTICATED, PERMISSION_DENIED):
                self._tokens.clear()   # looked up again: the service may have restarted with a new one
            call.finish(error=error_from_code(code, header.get("error") or "", header.get("details")))
            return call
        if not self.decode:
            call.finish((header, frames))
            return call
        try:
            call.finish((header.get("result") or {},
                         wire.decode_tensors(header.get("tensors", []), frames, self.limits, self.writable)))
        except Exception as exc:
            call.finish(error=exc)
        return call

    def _oversize(self, op, size):
        return InvalidArgumentError(f"request {op} of {size} bytes exceeds the limit of {self.service_max_bytes} "
                                    f"bytes (max_message_bytes) of the service at {self.address}")

    # ------------------------------------------------ giving up

    def give_up(self, call):
        """`call` is past its deadline and grace: failed UNAVAILABLE; returns the frames that cancel it."""
        self.pending.pop(call.id, None)
        call.finish(error=UnavailableError(
            f"no answer from {self.address} to {call.op} (request {call.id}) within its deadline and grace"))
        return self.cancel(call)

    def overdue(self, now):
        return [call for call in self.pending.values() if call.deadline is not None and now >= call.deadline]

    def lost(self, error_of, now):
        """The service is gone (silent, or no connection to send on): every call fails with `error_of(call)`, its
        name is looked up again, and the next attempt waits the back-off. Returns the calls failed."""
        failed = list(self.pending.values())
        for call in failed:
            call.finish(error=error_of(call))
        self.pending.clear()
        self.pings.clear()
        self.endpoint = None
        self.resolver.refresh(self.address)  # a restarted peer may be back under a new address
        self.retry_at = now + self.backoff
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)
        return failed

    def announced(self):
        """The service completed a handshake: the back-off is over."""
        self.retry_at, self.backoff = 0.0, BACKOFF_START
