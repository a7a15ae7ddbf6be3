"""The service side of the RPC base: one ROUTER socket, one loop, parked requests.

A handler either answers at once (returns `(result, tensors)`) or parks the
call (returns `PARKED`) and completes it later with `reply()`/`fail()`. A
parked call holds no thread: it is an entry in `self.parked` and, when it has a
deadline, in a heap. The service enforces deadlines itself (`on_deadline`), so
an operation is withdrawn before anyone stops waiting for it.

Built-in ops every service answers: `ping` (liveness, and which of the caller's
requests the service no longer holds), `cancel` (withdraw a parked request),
`bye` (the client is leaving: cancel its parked requests) and `info`.

A subclass serves the ops its `protocol` table declares (common/wire/protocol.py): `serve({Request: handler})`.
Before a declared op's handler runs, its sender is checked against the declared role (`_authorize`,
the one check point) and its args become the declaration (`validate`), so `call.args` is typed; an
undeclared op (a test's toy service) gets its args as the dict that came. Member and admin ops need a
credential: with CURVE a client key granted the role (common/rpc/encryption.py); without it the request
header must carry the role's token, the job's or the admin's (common/rpc/admin_token.py). A refused one is
answered UNAUTHENTICATED (no token) or PERMISSION_DENIED (a wrong one, a key without the role) before its
handler runs, and counted (stats member_refused, admin_refused). The socket has a ZAP domain, so libzmq
refuses pre-ZMTP-3 peers (an HTTP POST) before any frame reaches the loop.

A client that holds parked requests must be heard from (any message, pings
included) at least every `client_timeout` seconds; otherwise it is taken as
gone and its requests are cancelled, so a killed client never pins an element.
A client whose connection drops (its process died) is known sooner: the ROUTER
socket's monitor reports the disconnect of the connection its messages came on,
and its parked requests are cancelled at once, before anything is handed to them.
The monitor's events are read before a message's connection is recorded, so a closed
connection's event is never taken for a new one on the same fd number; and a reply that
meets a client gone before its event was read fails (ROUTER_MANDATORY) rather than
vanishing, so what it carried can be taken back (the broker's dequeues).
Both paths, and `bye`, go through `on_client_gone`, which a service extends for
what else it keeps per client.

What a peer may hold is bounded (docs/security.md): connections, the ZMTP handshake's time, an
unfinished message and unread replies (common/rpc/connections.py), and parked requests per client
(`max_parked_per_client`; a request past it is answered RESOURCE_EXHAUSTED, as is one from a client
whose replies wait unread). A client's parked requests are indexed by client, so withdrawing them is
O(1) each.
"""

import heapq
import hmac
import logging
import math
import os
import signal
import time
import uuid

import zmq

from zmqflow.common.rpc import admin_token, encryption as curve, health
from zmqflow.common.bind import BindError
from zmqflow.common.wire import frames as wire
from zmqflow.common.errors import (CancelledError, DeadlineExceededError, InternalError, InvalidArgumentError, OpError,
                                   ResourceExhaustedError, shown)
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.memory import release_freed_memory
from zmqflow.common.wire.protocol import CLIENT, Ops, ops_with_role
from zmqflow.common.rpc.resolver import default_resolver
from zmqflow.common.rpc.calls import Calls, client_socket
from zmqflow.common.rpc.connections import Connections
from zmqflow.common.rpc.sockets import connect_resolved, recv_monitor_message

log = logging.getLogger(__name__)


PARKED = object()
_ALWAYS_ADMITTED = frozenset((Ops.Ping.OP, Ops.Cancel.OP, Ops.Bye.OP))  # how a client at its bounds gets out
_DRAIN_BATCH = 256
_COMPACT_MIN = 1024  # the deadline heap is rebuilt without answered calls once it is this long and twice live


class Call:
    """One request as the handler sees it.

    `state` is the handler's object for a parked call (a queue ticket, an ensemble's gather), which usually
    refers back to the call; `reply` and `fail` let go of it, so an answered request and what it carried are
    freed by reference counting at once, not by a full collection of the cyclic GC that large buffers seldom
    trigger (the aggregator kept hundreds of answered requests that way, issue 27).
    """

    __slots__ = ("identity", "id", "op", "args", "tensors", "deadline", "received", "finished", "state")

    def __init__(self, identity, rid, op, args, tensors, deadline, received):
        self.identity, self.id, self.op, self.args, self.tensors = identity, rid, op, args, tensors
        self.deadline, self.received = deadline, received
        self.finished = False
        self.state = None  # the handler's own object for a parked call (e.g. a queue ticket)

    @property
    def key(self):
        return (self.identity, self.id)


class Service:
    """Subclass and register handlers with `self.handlers[op] = fn(call)`."""

    name = "service"
    protocol = None
    """The table of ops this service answers besides the common ones (common/wire/protocol.py's BrokerOps, ...)."""

    def __init__(self, bind, limits=DEFAULT_LIMITS, client_timeout=30.0, context=None, curve_dir=None):
        self.limits = limits
        self.client_timeout = client_timeout
        self.context = context or zmq.Context.instance()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.setsockopt(zmq.MAXMSGSIZE, limits.socket_max_frame_bytes)
        self.socket.setsockopt(zmq.HANDSHAKE_IVL, limits.handshake_timeout_ms)  # half-open peers go
        self.socket.sndhwm = self.socket.rcvhwm = 100_000
        # a reply to a client that is gone fails at once (EHOSTUNREACH) instead of vanishing: what it carried
        # (a dequeue's elements) can be taken back (reply() says whether it was delivered)
        self.socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.curve_dir = curve_dir or curve.curve_dir_from_env()  # CURVE keys, or a warning when exposed
        try:
            curve.secure_server(self.socket, bind, curve.ServerKeys(self.curve_dir) if self.curve_dir else None)
        except Exception:  # refused (protected mode, bad keys): the socket goes, or its context could never end
            self.socket.close(0)
            raise
        # dropped connections: a client that died holding parked requests is cancelled at once; new ones counted,
        # and a peer that closes before its handshake taken as refused (RefusedPeers)
        self._monitor = self.socket.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED |
                                                       curve.RefusedPeers.EVENTS)
        self._curve = bool(self.curve_dir)
        self.connections = Connections(limits.max_connections, limits.socket_max_frame_bytes,
                                       limits.max_unread_reply_bytes, self._curve, self.name)
        self._max_unread = limits.max_unread_reply_bytes
        try:
            self.socket.bind(bind)
        except zmq.ZMQError as exc:   # in use, no such interface, a bad URL: the caller's --bind
            self._monitor.close(0)
            self.socket.close(0)
            raise BindError(f"cannot listen on {bind}: {zmq.strerror(exc.errno)}") from None
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        health.announce(self.endpoint)
        # without CURVE, admin and member ops need their token (from the environment, else made and written to
        # a 0600 file); with CURVE, the roles of the client's key
        self.tokens, self._token_files = {}, []   # role -> token; (path, token, kind) of the files written
        for role, kind in () if self.curve_dir else admin_token.FOR_ROLE.items():
            ops = ops_with_role(self.protocol, role) if self.protocol else set()
            if ops:
                self.tokens[role], path = admin_token.for_service(self.endpoint, sorted(ops), kind)
                self._token_files += [(path, self.tokens[role], kind)] if path else []
        self._token_bytes = {role: token.encode() for role, token in self.tokens.items()}  # compared per request
        self.parked = {}
        self._parked_by = {}  # identity -> {key: call}: its parked calls, for the cap and O(1) withdrawal
        self._deadlines = []
        self._compact_at = _COMPACT_MIN  # the heap's length that triggers dropping answered calls from it
        self._seq = 0
        self._last_seen = {}
        self._fd_of = {}   # identity -> the fd of the connection its last message came on
        self._running = False
        self.started = time.monotonic()
        self.stats = {"requests": 0, "errors": 0, "bad_requests": 0, "deadlines": 0, "admin_refused": 0,
                      "member_refused": 0}
        self.refused_peers = curve.RefusedPeers(f"{self.name} at {self.endpoint}", self.stats)
        self.op_stats = None  # zmqflow.common.processes.metrics.OpStats: requests timed per op, only with --metrics-bind
        self.metrics_address = None
        self.handlers, self.requests = {}, {}  # op -> handler; op -> its declaration (the declared ones)
        self.serve({Ops.Ping: self._ping, Ops.Cancel: self._cancel, Ops.Bye: self._bye, Ops.Info: self._info})
        self._poller = zmq.Poller()
        self._extra_sockets = {}  # socket, or the fd of one added by_fd -> on_readable(): polled by this loop
        self._by_fd = {}          # fd -> socket, of those polled by their fd (add_socket's by_fd)
        self._recheck = set()     # fds of by_fd sockets sent on since the loop last waited (`sent_on`)
        self._router_fd = self.add_socket(self.socket, self._drain, by_fd=True)
        self.add_socket(self._monitor, self._watch_connections, by_fd=True)

    def serve(self, handlers):
        """Answer each declared request ({Request class: fn(call)}) with its handler."""
        for request, handler in handlers.items():
            self.handlers[request.OP] = handler
            self.requests[request.OP] = request

    # ------------------------------------------------ hooks for subclasses

    def on_deadline(self, call):
        """The parked `call` reached its deadline: withdraw it. Default: just fail it."""
        self.fail(call, DeadlineExceededError("Timed out waiting for notification"))

    def on_cancel(self, call, error):
        """Withdraw the parked `call` (client cancel, client gone). Default: fail it."""
        self.fail(call, error)

    def on_client_gone(self, identity, error):
        """The client `identity` is gone (connection dropped, `bye`, or silent while it waited):
        withdraw its parked requests. A service that keeps more for a client (the broker's
        leases) extends this to let go of it too."""
        for call in list(self._parked_by.get(identity, {}).values()):
            if not call.finished:
                self.on_cancel(call, error)

    def keeps_state_for(self, identity):
        """True while the service holds something for a silent client besides parked requests (the
        broker's leases): its connection then stays watched, so its disconnect is still noticed."""
        return False

    def describe(self):
        """Extra fields for `info`."""
        return {}

    def housekeeping(self, now):
        """Called about once a second from the loop: a subclass's periodic upkeep (the broker's memory)."""

    def add_socket(self, sock, on_readable, by_fd=False):
        """Poll `sock` in this loop too (e.g. a DEALER to a peer); `on_readable()` drains it. Returns the key
        it is polled by: the socket, or with `by_fd` its ZMQ_FD.

        Why by_fd: zmq_poll asks every ZeroMQ socket it is given for its events twice a wait (a poll and a
        getpid system call each), 18 calls a wake-up for an aggregator's 8 sockets, about 54 a request. A
        socket's FD only signals commands not yet processed, so one polled by it must be read by
        `on_readable()` until `wire.readable` says no (as the drains here do), and whoever sends on it (or
        connects it) calls `sent_on(fd)`: that may process the command that said a message came, and the
        loop asks such a socket itself before it waits."""
        key = sock.getsockopt(zmq.FD) if by_fd else sock
        if by_fd:
            # asked once before the loop first waits: a pipe attached in a call of ours (a connect) signals
            # nothing for its first messages until a read has found it empty
            self._by_fd[key] = sock
            self._recheck.add(key)
        self._extra_sockets[key] = on_readable
        self._poller.register(key, zmq.POLLIN)
        return key

    def remove_socket(self, sock):
        key = next((fd for fd, s in self._by_fd.items() if s is sock), sock)
        if self._extra_sockets.pop(key, None) is not None:
            self._poller.unregister(key)
            self._by_fd.pop(key, None)
            self._recheck.discard(key)

    def sent_on(self, fd):
        """A by_fd socket (add_socket's key `fd`) was sent on: the loop asks it for messages before it waits."""
        self._recheck.add(fd)

    def _ready_unsignalled(self):
        """The by_fd sockets with a message waiting that their FD may not show: those sent on (a reply on the
        service's own socket included) or left unread since the last wait."""
        ready = []
        if self._recheck:
            for fd in self._recheck:
                sock = self._by_fd.get(fd)
                if sock is not None and not sock.closed and wire.readable(sock):
                    ready.append(fd)
            self._recheck.clear()
        return ready

    def close(self):
        if self._monitor is not None:
            self.socket.disable_monitor()
            self._monitor.close(0)
            self._monitor = None
        self.socket.close(linger=500)  # the last replies (a shutdown's own) still leave; bounded
        for path, token, kind in self._token_files:
            admin_token.forget_file(path, token, kind)
        self._token_files = []

    # ------------------------------------------------ completing calls

    def park(self, call):
        self.parked[call.key] = call
        mine = self._parked_by.get(call.identity)
        if mine is None:
            mine = self._parked_by[call.identity] = {}
        mine[call.key] = call
        if call.deadline is not None:
            self._push_timer(call.deadline, call.key)
        return PARKED

    def _push_timer(self, when, key):
        """An entry in the deadline heap: a parked call's key (never the call: an answered call, its tensors and
        its ticket must go when it is answered, not when its deadline comes; the broker held every batch a
        worker dequeued for its 600 s timeout, 17.7 GB), or None for a wake-up. Answered calls' entries leave
        lazily; past twice what is parked, the heap is rebuilt without them (amortized O(1) a push)."""
        heap = self._deadlines
        self._seq += 1
        heapq.heappush(heap, (when, self._seq, key))
        if len(heap) >= self._compact_at:
            parked = self.parked
            heap[:] = [entry for entry in heap if entry[2] is None or entry[2] in parked]
            heapq.heapify(heap)
            self._compact_at = max(_COMPACT_MIN, 2 * len(heap))

    def reply(self, call, result=None, tensors=()):
        """Answer `call`; whether the answer reached its client's connection (False: the client is gone,
        or it was answered before)."""
        if call.finished:
            return False
        call.finished, call.state = True, None  # answered: nothing of its handler's stays with it 
        parked = self.parked.pop(call.key, None)
        if parked is not None:
            self._unpark(call)
        if self.op_stats is not None:
            self.op_stats.observe(call.op, call.received, 0, parked is not None)
        return self._send(call.identity, wire.reply_frames(call.id, 0, None, result, tensors))

    def fail(self, call, error):
        if call.finished:
            return
        call.finished, call.state = True, None
        parked = self.parked.pop(call.key, None)
        if parked is not None:
            self._unpark(call)
        self.stats["errors"] += 1
        if self.op_stats is not None:
            self.op_stats.observe(call.op, call.received, error.code, parked is not None)
        self._send(call.identity, wire.reply_frames(call.id, error.code, error.message, details=error.details))

    def _unpark(self, call):
        mine = self._parked_by[call.identity]
        del mine[call.key]
        if not mine:
            del self._parked_by[call.identity]

    def _send(self, identity, frames):
        """Whether the message went out: a client that is gone (EHOSTUNREACH) or whose queue is full (EAGAIN)
        loses the reply, never the loop. What went is counted against its connection's unread replies."""
        self._recheck.add(self._router_fd)  # sent on (see add_socket's by_fd)
        try:
            wire.send_message(self.socket, frames, identity)
            self.connections.sent(self._fd_of.get(identity), frames)
            return True
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                log.info("reply to %r dropped: its client is gone", identity)
            else:
                log.warning("reply to %r dropped: %s", identity, exc)
            return False

    # ------------------------------------------------ the loop

    def run(self, install_signals=True):
        """Serve until `stop()` (or SIGTERM/SIGINT when `install_signals`)."""
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self.stop())
        self._running = True
        poller, handlers = self._poller, self._extra_sockets
        next_sweep = time.monotonic() + 1.0
        while self._running:
            now = time.monotonic()
            wait = self._next_wake(next_sweep) - now
            ready = self._ready_unsignalled()
            # whole milliseconds, rounded up: a sub-millisecond timeout would be 0, a busy spin
            events = poller.poll(0 if ready else math.ceil(max(0.0, min(wait, 0.1)) * 1000))
            for key in ready + [key for key, _ in events if key not in ready]:
                handler = handlers.get(key)   # None: removed by an earlier handler of this round
                if handler is not None:
                    handler()
            now = time.monotonic()
            self._expire(now)
            self.connections.check(now, self._readable)
            if now >= next_sweep:
                if self.connections.trim_due:  # libzmq has freed a dropped peer's unfinished message by now
                    self.connections.trim_due = False
                    release_freed_memory()
                self._sweep_clients(now)
                self.housekeeping(now)
                next_sweep = now + 1.0
        self.close()

    def stop(self):
        self._running = False

    def _readable(self):
        self._recheck.add(self._router_fd)  # asking processes its commands too
        return wire.readable(self.socket)

    def _drain(self):
        """Up to _DRAIN_BATCH messages, taken while there are. The socket is asked (`wire.readable`) once,
        after the first: a lone request ends there; a run of them ends at NOBLOCK's zmq.Again, which costs
        two asks but saves one per message."""
        self._watch_connections()   # connections that came or went before these messages did
        for i in range(_DRAIN_BATCH):
            if i == 1 and not wire.readable(self.socket):
                return
            try:
                message = wire.recv_message(self.socket, True, self.limits, self._curve, zmq.NOBLOCK)
            except zmq.Again:
                return
            except Exception as exc:  # never let one message stop the loop
                log.exception("receive failed: %s", exc)
                while self.socket.rcvmore:
                    self.socket.recv(copy=False)
                continue
            self._handle(*message)
        else:
            self._recheck.add(self._router_fd)  # more may wait: read after the loop's other sockets

    def _handle(self, identity, header, frames, error):
        now = time.monotonic()
        self._last_seen[identity] = now
        fd, conn = identity.fd, None
        if fd is not None:
            if self._fd_of.get(identity) != fd:
                # a client on a new connection: the monitor's events first. A connection that closed before
                # this one was accepted (and whose fd number this one may reuse) said so before this message
                # came, so its event is read now and cannot be taken later for this client's (a live
                # client's requests were cancelled that way). Each drain reads them too (_drain).
                self._watch_connections()
                self._fd_of[identity] = fd
            conn = self.connections.received(fd, identity.wire_bytes)
        self.stats["requests"] += 1
        rid = header.get("id") if header is not None and type(header.get("id")) is int else 0
        if error is not None:
            # answered without raising it: a raised exception's traceback would hold this frame, and the
            # frame the exception, a cycle that kept refused frames alive until a collection (about 900 MB
            # after 50 refused 24 MiB frames)
            self._refuse(identity, header, rid, error, now)
            if "max_message_bytes" in error.message:
                release_freed_memory()
            return
        try:
            op, rid, deadline_ms, args = wire.check_request(header, self.limits)
            handler = self.handlers.get(op)
            if handler is None:
                raise InvalidArgumentError(f"unknown op {op!r} for {self.name}; known: {', '.join(sorted(self.handlers))}")
            if (identity in self._parked_by or (conn is not None and conn.unread > self._max_unread)) \
                    and op not in _ALWAYS_ADMITTED:
                self._admit(identity, conn)
            request = self.requests.get(op)
            if request is not None:
                if request.ROLE != CLIENT:
                    self._authorize(request, header, identity)
                args = request.validate(args)
            tensors = wire.decode_tensors(header.get("tensors", []), frames, self.limits)
            deadline = None if deadline_ms is None else now + deadline_ms / 1000.0
            call = Call(identity, rid, op, args, tensors, deadline, now)
            if call.key in self.parked:
                raise InvalidArgumentError(f"request id {rid} is already pending")
            answer = handler(call)
            if answer is not PARKED:
                result, tensors = answer if isinstance(answer, tuple) else (answer, ())
                self.reply(call, result, tensors)
        except OpError as exc:
            self._refuse(identity, header, rid, exc, now)
        except Exception:  # a bug in a handler must not kill the loop, nor show a peer its text
            self._internal_error(identity, header, rid, now)

    def _internal_error(self, identity, header, rid, now):
        """Answer an unexpected exception with INTERNAL and an id only; its class, message and traceback
        go to this service's log under that id (docs/security.md). OpErrors raised on purpose
        keep their message."""
        error_id = uuid.uuid4().hex[:12]
        log.exception("internal error %s handling %s", error_id, shown(admin_token.without_token(header)))
        self.stats["errors"] += 1
        if self.op_stats is not None:
            self.op_stats.observe(self._op_label(header), now, InternalError.code, False)
        message = f"internal error (id {error_id}; the {self.name}'s log has the details)"
        self._send(identity, wire.reply_frames(rid, InternalError.code, message))

    def _authorize(self, request, header, identity):
        """The one check of a member or admin op's sender against the role its declaration names: with
        CURVE, a client key granted that role (ZAP's User-Id on the identity's frame), without it the role's
        token (the job token, the admin token) in the header. (A client op is not checked: `_handle`.)"""
        role = request.ROLE
        presented = header.get(admin_token.HEADER)
        if not self.curve_dir and type(presented) is str and hmac.compare_digest(presented.encode(),
                                                                                 self._token_bytes[role]):
            return   # the common case, in one step; what follows names what is wrong
        try:
            if self.curve_dir:
                curve.check_role(identity.user_id(), role, request.OP, self.name, self.endpoint)
            else:
                admin_token.check(self.tokens[role], header.get(admin_token.HEADER), request.OP, self.name,
                                  self.endpoint, admin_token.FOR_ROLE[role])
        except OpError as exc:
            self.stats[f"{role}_refused"] += 1
            log.warning("refused %s: %s", request.OP, exc)
            raise

    def _admit(self, identity, conn):
        """ResourceExhausted for a client at a bound: max_parked_per_client requests parked, or replies it
        has not read past max_unread_reply_bytes (an amplifying request, a pull, is not run for it again).
        `_handle` calls it only for a client with parked requests or unread replies at the last look."""
        mine = self._parked_by.get(identity)
        if mine is not None and len(mine) >= self.limits.max_parked_per_client:
            self.connections.refused["parked_requests"] += 1
            raise ResourceExhaustedError(f"this client has {len(mine)} requests waiting in {self.name}, the "
                                         f"max_parked_per_client limit ({self.limits.max_parked_per_client})")
        unread = conn is not None and self.connections.congested(conn)
        if unread:
            raise ResourceExhaustedError(f"this client leaves {unread} bytes of replies unread, over the "
                                         f"max_unread_reply_bytes limit ({self.limits.max_unread_reply_bytes}): "
                                         "read them first")

    def _refuse(self, identity, header, rid, error, now):
        """Answer a request with its error (an OpError), counted."""
        if isinstance(error, InvalidArgumentError):
            self.stats["bad_requests"] += 1
        self.stats["errors"] += 1
        if self.op_stats is not None:
            self.op_stats.observe(self._op_label(header), now, error.code, False)
        self._send(identity, wire.reply_frames(rid, error.code, error.message, details=error.details))

    def _op_label(self, header):
        """The op of a refused request for metrics: a known op's name, else 'unknown' (bounded labels)."""
        op = header.get("op") if isinstance(header, dict) else None
        return op if isinstance(op, str) and op in self.handlers else "unknown"

    def _expire(self, now):
        heap, parked = self._deadlines, self.parked
        while heap and heap[0][0] <= now:
            key = heapq.heappop(heap)[2]
            call = None if key is None else parked.get(key)  # None: a wake-up of `wake_at`, or answered
            # the deadline too: a later request may have taken an answered one's key (its id, reused)
            if call is not None and not call.finished and call.deadline <= now:
                self.stats["deadlines"] += 1
                self.on_deadline(call)

    def wake_at(self, when):
        """Make the loop run `_expire` by `when` (monotonic s): subclasses' timers (batches, probes)."""
        self._push_timer(when, None)

    def _next_wake(self, default):
        """The earliest pending deadline or wake-up, dropping the entries of calls already answered
        (most calls finish long before their deadline: without this the loop would wake for each)."""
        heap, parked = self._deadlines, self.parked
        while heap and heap[0][2] is not None and heap[0][2] not in parked:
            heapq.heappop(heap)
        return min(default, heap[0][0]) if heap else default

    def _watch_connections(self):
        """The monitor's events: a new connection is counted (connections.py), a dropped one cancels the
        parked requests of the clients on it."""
        while self._monitor is not None and wire.readable(self._monitor):
            event = recv_monitor_message(self._monitor)
            self.refused_peers.seen(event)
            if event["event"] == zmq.EVENT_ACCEPTED:
                self.connections.accepted(event["value"], time.monotonic())
                continue
            if event["event"] != zmq.EVENT_DISCONNECTED:
                continue
            self.connections.closed(event["value"])
            gone = [identity for identity, fd in self._fd_of.items() if fd == event["value"]]
            for identity in gone:
                del self._fd_of[identity]
                if identity in self._parked_by:
                    log.info("client %r disconnected: cancelling its parked requests", identity)
                self.on_client_gone(identity, CancelledError("client disconnected: its requests were cancelled"))

    def _sweep_clients(self, now):
        gone = [i for i in self._parked_by if now - self._last_seen.get(i, now) > self.client_timeout]
        for identity in gone:
            log.info("client %r silent for more than %.0f s: cancelling its requests", identity, self.client_timeout)
            self.on_client_gone(identity, CancelledError("client went away: its requests were cancelled"))
        for identity, seen in list(self._last_seen.items()):
            if now - seen > self.client_timeout and not self.keeps_state_for(identity):
                del self._last_seen[identity]
                self._fd_of.pop(identity, None)

    # ------------------------------------------------ built-in ops

    def _ping(self, call):
        unknown = [i for i in call.args.ids if (call.identity, i) not in self.parked]
        return {"unknown": unknown, "service": self.name, "max_message_bytes": self.limits.max_message_bytes}

    def _cancel(self, call):
        target = self.parked.get((call.identity, call.args.target))
        if target is None:
            return {"cancelled": False}
        self.on_cancel(target, CancelledError(f"request {target.id} ({target.op}) was cancelled by the client"))
        return {"cancelled": True}

    def _bye(self, call):
        self.on_client_gone(call.identity, CancelledError("client closed: its requests were cancelled"))
        self._last_seen.pop(call.identity, None)
        return {}

    def _info(self, call):
        return {"service": self.name, "endpoint": self.endpoint, "pid": os.getpid(),
                "uptime_s": round(time.monotonic() - self.started, 3), "parked": len(self.parked),
                "timers": len(self._deadlines), "connections": len(self.connections),
                "stats": dict(self.stats), "refused": dict(self.connections.refused), "curve": bool(self.curve_dir),
                "metrics": self.metrics_address,
                **self.describe()}


class LoopClient:
    """Calls from a service's own loop to the service at `address`: the in-loop driver of common/rpc/calls.py.

    The socket and its monitor are polled by `service`'s loop: an answer calls `on_reply(call)` (its value
    the reply's (header, frames), for the owner to check), a dropped connection `on_lost()`, so a peer whose
    process died is known at once. Nothing waits: `connect()` connects to where the name resolves now; the
    owner keeps its own deadlines (the service's heap), and `expire(now)` gives up, cancelling at the peer,
    the calls past their deadline and grace, so nothing is kept for a peer that never answers.

    `context`: the ZeroMQ context its socket lives in, its owner's to terminate (the aggregator passes its service's:
    one I/O thread for the client side and every member); without one the client makes its own. Sharing is safe
    because links connect to addresses, never names (common/rpc/resolver.py: no lookup runs in an I/O thread), and
    cheaper on few cores: with a context per member, an aggregator over 3 ran 4 I/O threads that woke 8 times per
    request; with one, 6 times (issue 26).
    """

    def __init__(self, service, address, name, on_reply, on_lost, resolver=default_resolver, hwm=10_000,
                 context=None):
        self.service, self.address, self.on_reply, self.on_lost = service, address, on_reply, on_lost
        self.calls = Calls(address, service.limits, resolver, decode=False)
        self._own_context = context is None
        self.context = zmq.Context(io_threads=1) if context is None else context
        # a full queue fails the send at once instead of blocking the loop; CURVE checks the peer's key
        self.sock = client_socket(self.context, service.limits, name, hwm=hwm, send_timeout_ms=0)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self._fd = service.add_socket(self.sock, self._drain, by_fd=True)  # read by _drain, sends say sent_on
        service.add_socket(self.monitor, self._watch, by_fd=True)

    @property
    def endpoint(self):
        return self.calls.endpoint

    def connect(self):
        """Connect to the address the name resolves to now, leaving the one connected before; that address,
        or None while the name does not resolve (the lookup goes on in the background)."""
        endpoint = self.calls.resolver.endpoint(self.address)
        if endpoint is not None and endpoint != self.calls.endpoint:
            if self.calls.endpoint is not None:
                self.sock.disconnect(self.calls.endpoint)
            connect_resolved(self.sock, endpoint)
            self.calls.endpoint = endpoint
            self.service.sent_on(self._fd)  # connecting processes the socket's commands too
        return endpoint

    def submit(self, op, args=None, tensors=(), timeout=None, rid=None, encoded=None):
        """Send a request now (`rid`: the owner's id, unique among its calls here; `encoded`: see
        Calls.request); its Call. A send that cannot go at once raises zmq.ZMQError."""
        call, frames = self.calls.request(op, args, tensors, timeout, time.monotonic(), rid=rid, encoded=encoded)
        try:
            wire.send_message(self.sock, frames)
        except zmq.ZMQError:
            self.calls.pending.pop(call.id, None)
            raise
        finally:
            self.service.sent_on(self._fd)
        return call

    def cancel(self, call):
        """Withdraw `call` at the peer; its answer, if one still comes, is dropped."""
        if self.calls.pending.pop(call.id, None) is not None:
            try:
                wire.send_message(self.sock, self.calls.cancel(call))
            except zmq.ZMQError:
                pass
            self.service.sent_on(self._fd)

    def expire(self, now):
        for call in self.calls.overdue(now):
            try:
                wire.send_message(self.sock, self.calls.give_up(call))
            except zmq.ZMQError:
                pass  # best effort: the peer drops the request at its deadline anyway
            self.service.sent_on(self._fd)

    def _drain(self):
        """The replies waiting (the service's poller said one does: it is read without asking again)."""
        sock, calls = self.sock, self.calls
        while not sock.closed:
            try:   # NOBLOCK: the poller's word may be stale (a reply read by then), and a wait here a hang
                call = calls.received(*wire.recv_message(sock, False, calls.limits, flags=zmq.NOBLOCK)[1:])
            except zmq.Again:
                return
            if call is not None:
                self.on_reply(call)
            if sock.closed or not wire.readable(sock):
                return

    def _watch(self):
        lost = False
        while not self.sock.closed and wire.readable(self.monitor):
            lost = recv_monitor_message(self.monitor)["event"] == zmq.EVENT_DISCONNECTED or lost
        if lost:
            self.calls.resolver.refresh(self.address)  # reconnected by the owner to where the name points then
            self.on_lost()

    def close(self):
        self.service.remove_socket(self.sock)
        self.service.remove_socket(self.monitor)
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)
        if self._own_context:
            self.context.term()
