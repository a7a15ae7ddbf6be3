"""The all-reduce ring over ZeroMQ: who is on it, the chunks between neighbours, and the lost-worker rules.

Every worker binds one ROUTER (its `--bind`), guarded as a pipeline's stage link is (a member's CURVE key,
else the job token over ZAP PLAIN: stage_link.py's `bind_peer`), and dials the peers it sends to with a
DEALER each (`connect_peer`). Everything a worker hears arrives on its ROUTER; every message is the wire
format's request frames (common/wire/frames.py), op = kind, args = {"rank", "epoch", ...}.

- Forming: workers 1..n-1 send `hello` (rank, endpoint) to the chief's endpoint (`--chief`) until it
  answers; once all n said hello the chief sends each one `ring`: the members (rank -> endpoint), the
  ring's epoch, and its own state (global step, variables and optimizer slots). Every replica starts from
  the chief's bytes, so the replicas are bit-identical whatever each one computed at start (a restored
  checkpoint included).
- A step: `all_reduce(buffer)` drives ring.py's generator: each chunk goes to the next member in rank
  order as `chunk` (epoch, step, exchange) and the one from the previous member is awaited.
- Liveness: a thread beats (`beat`) every lost_after / 5 s, the chief to every member, the others to the
  chief, so a worker busy computing still looks alive. While a worker waits it reads every message and
  checks the clock: the chief takes a member silent for `lost_after` s for lost, the others take a silent
  chief for lost. By `lost_policy` the chief then sends `abort` naming the lost worker (every worker
  raises AbortedError with that name: exit 3, the peer-lost code) or re-forms the ring without it: a new
  epoch and `ring` with the chief's state; every worker drops the step in hand (RingReformed) and goes on
  from that state. A lost chief ends the job either way: it is the one that checkpoints.
"""

import logging
import threading
import time

import numpy as np
import zmq

from zmqflow.common.errors import AbortedError, InvalidArgumentError, UnavailableError
from zmqflow.common.rpc import encryption as curve
from zmqflow.common.wire import frames as wire
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.services.worker import ring
from zmqflow.services.worker.stage_link import bind_peer, connect_peer, peer_socket

log = logging.getLogger("allreduce")

HELLO, RING, CHUNK, BEAT, ABORT = "hello", "ring", "chunk", "beat", "abort"
LOST_POLICIES = ("continue", "abort")
CHIEF = 0


class RingReformed(Exception):
    """The chief re-formed the ring without a lost worker: the step in hand is dropped. `state` is the
    chief's (global_step, {name: array}) to go on from (None on the chief, which keeps its own)."""

    def __init__(self, state, lost):
        super().__init__(f"the ring was re-formed without workers {lost}")
        self.state, self.lost = state, lost


class RingLink:
    """One worker's end of the ring. `state()` (the chief's) gives (global_step, {name: array}) to send."""

    def __init__(self, rank, num_workers, bind, chief=None, lost_after=5.0, lost_policy="abort",
                 join_timeout=120.0, context=None, job_token=None, curve_dir=None, limits=DEFAULT_LIMITS):
        if lost_policy not in LOST_POLICIES:
            raise InvalidArgumentError(f"lost_policy must be one of {', '.join(LOST_POLICIES)}, got {lost_policy!r}")
        if rank != CHIEF and not chief:
            raise InvalidArgumentError(f"worker {rank} of an all-reduce job needs the chief's endpoint (--chief)")
        if not lost_after or lost_after <= 0:
            raise InvalidArgumentError(f"lost_after must be a positive number of seconds, got {lost_after!r}")
        self.rank, self.num_workers, self.chief = rank, num_workers, chief
        self.lost_after, self.lost_policy, self.join_timeout = float(lost_after), lost_policy, join_timeout
        self.limits, self._credentials = limits, (curve_dir, job_token)
        self.context = context or zmq.Context()
        self.inbox = peer_socket(self.context, zmq.ROUTER, self.lost_after, limits)
        self.endpoint = bind_peer(self.inbox, bind, curve_dir, job_token)
        self.epoch, self.members = 0, {}    # the ring's epoch, {rank: endpoint} of its members
        self.lost = []                      # ranks dropped from the ring, in order
        self.last_seen = {}                 # rank -> monotonic time of its last message
        self._peers = {}                    # endpoint -> DEALER of this thread
        self._chunks = {}                   # (epoch, step, exchange) -> chunk that came early
        self._state = None
        self._beats = _Heartbeats(self)

    # ------------------------------------------------ forming the ring

    def join(self, state=None):
        """Form the ring. The chief (`state`: its state callable) waits until every worker said hello and
        sends them the ring; returns None. A worker says hello until the ring comes; returns the chief's
        state (global_step, {name: array}). Bounded by `join_timeout`."""
        deadline = time.monotonic() + self.join_timeout
        if self.rank == CHIEF:
            self._state = state
            joined = {CHIEF: self.endpoint}
            while len(joined) < self.num_workers:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.num_workers)) - set(joined))
                    raise UnavailableError(f"all-reduce: workers {missing} did not join the ring at {self.endpoint} "
                                           f"within {self.join_timeout:.0f} s")
                message = self._receive(0.1)
                if message is not None and message[0] == HELLO:
                    args = message[1]
                    joined[int(args["rank"])] = args["endpoint"]
                    self.last_seen[int(args["rank"])] = time.monotonic()
            log.info("chief: %d workers joined the ring", len(joined))
            self._form(joined)
            return None
        next_hello = 0.0
        while True:
            now = time.monotonic()
            if now > deadline:
                raise UnavailableError(f"all-reduce: worker {self.rank} got no ring from the chief at {self.chief} "
                                       f"within {self.join_timeout:.0f} s")
            if now >= next_hello:
                self._send(self.chief, HELLO, {"endpoint": self.endpoint}, block=False)
                next_hello = now + 0.5
            message = self._receive(0.1)
            if message is not None and message[0] == RING:
                return self._adopt_ring(*message[1:])

    def _form(self, members):
        """Chief: a new epoch of the ring over `members` ({rank: endpoint}); each other member gets it and
        the chief's state."""
        self.epoch += 1
        self.members = dict(sorted(members.items()))
        self._chunks = {k: v for k, v in self._chunks.items() if k[0] >= self.epoch}
        step, values = self._state()
        names = sorted(values)
        for rank, endpoint in self.members.items():
            if rank != CHIEF:
                self._send(endpoint, RING, {"members": {str(r): e for r, e in self.members.items()}, "step": step,
                                            "names": names}, [values[n] for n in names])
        self._beats.targets = tuple(e for r, e in self.members.items() if r != CHIEF)
        self._beats.start_once()
        log.info("chief: ring epoch %d over workers %s", self.epoch, list(self.members))

    def _adopt_ring(self, args, tensors):
        self.epoch, self.members = int(args["epoch"]), {int(r): e for r, e in sorted(args["members"].items(),
                                                                                       key=lambda i: int(i[0]))}
        self._chunks = {k: v for k, v in self._chunks.items() if k[0] >= self.epoch}
        self.last_seen[CHIEF] = time.monotonic()
        self._beats.targets = (self.chief,)
        self._beats.start_once()
        log.info("worker %d: ring epoch %d over workers %s", self.rank, self.epoch, list(self.members))
        return int(args["step"]), {n: np.array(t) for n, t in zip(args["names"], tensors)}

    # ------------------------------------------------ one all-reduce

    def all_reduce(self, buffer, step):
        """Sum `buffer` in place over the ring (every member ends with the same bytes). Its chunks are sent
        without a copy (ring.py says why that is safe): do not write `buffer` after the call, use a new one.
        Raises RingReformed when the ring changed under the step, AbortedError when the job cannot go on."""
        ranks = list(self.members)
        position, n = ranks.index(self.rank), len(ranks)
        next_endpoint = self.members[ranks[(position + 1) % n]]
        epoch, exchanges = self.epoch, ring.all_reduce(buffer, position, n)
        outgoing, exchange = next(exchanges, None), 0
        while outgoing is not None:
            self._send(next_endpoint, CHUNK, {"step": step, "exchange": exchange}, [outgoing])   # ring.py: no copy
            incoming = self._await_chunk((epoch, step, exchange))
            exchange += 1
            try:
                outgoing = exchanges.send(incoming)
            except StopIteration:
                outgoing = None
        if n == 1:
            self._check_peers()     # a ring of one still hears an abort, and beats

    def _await_chunk(self, key):
        while key not in self._chunks:
            self._check_peers()
            message = self._receive(0.05)
            if message is not None:
                self._handle(*message)
        return self._chunks.pop(key)

    def _handle(self, kind, args, tensors):
        if kind == CHUNK:
            key = (int(args["epoch"]), int(args["step"]), int(args["exchange"]))
            if key[0] >= self.epoch:    # a neighbour may start the next epoch before its ring reaches us
                self._chunks[key] = tensors[0]
        elif kind == RING and self.rank != CHIEF and int(args["epoch"]) > self.epoch:
            lost = sorted(set(self.members) - {int(r) for r in args["members"]})
            raise RingReformed(self._adopt_ring(args, tensors), lost)
        elif kind == ABORT:
            raise AbortedError(args["reason"])

    def _check_peers(self):
        """Drain what arrived, then apply the lost-worker rules to whoever stayed silent too long."""
        while (message := self._receive(0)) is not None:
            self._handle(*message)
        now = time.monotonic()
        if self.rank != CHIEF:
            silent = now - self.last_seen.get(CHIEF, now)
            if silent > self.lost_after:
                raise AbortedError(f"worker 0 (the chief) was lost: silent for {silent:.1f} s (--lost-after-secs "
                                   f"{self.lost_after:g}); an all-reduce job cannot go on without its chief")
            return
        lost = [r for r in self.members if r != CHIEF and now - self.last_seen.get(r, now) > self.lost_after]
        if not lost:
            return
        silence = ", ".join(f"worker {r} silent for {now - self.last_seen[r]:.1f} s" for r in lost)
        if self.lost_policy == "abort":
            reason = (f"worker {', '.join(map(str, lost))} was lost ({silence}, --lost-after-secs "
                      f"{self.lost_after:g}): the all-reduce job cannot go on without it (--lost-policy abort)")
            for rank, endpoint in self.members.items():
                if rank != CHIEF:
                    self._send(endpoint, ABORT, {"reason": reason}, block=False)
            log.error("chief: %s", reason)
            raise AbortedError(reason)
        self.lost += lost
        for rank in lost:      # one that was only slow hears that it is out, and stops
            self._send(self.members[rank], ABORT, {"reason": f"worker {rank} was dropped from the ring as lost "
                                                             f"({silence})"}, block=False)
        log.warning("chief: %s: lost; the ring goes on without it (--lost-policy continue)", silence)
        self._form({r: e for r, e in self.members.items() if r not in lost})
        raise RingReformed(None, lost)

    # ------------------------------------------------ messages

    def _receive(self, timeout):
        """(kind, args, tensors) of the next message within `timeout` s (a beat too), or None; notes who is
        alive."""
        if not self.inbox.poll(timeout * 1000):
            return None
        _, header, frames, error = wire.recv_message(self.inbox, True, self.limits)
        if error is not None:
            log.warning("worker %d: a malformed ring message was dropped: %s", self.rank, error)
            return None
        args = header.get("args") or {}
        if "rank" in args:
            self.last_seen[int(args["rank"])] = time.monotonic()
        return header.get("op"), args, wire.decode_tensors(header.get("tensors"), frames, self.limits)

    def _send(self, endpoint, kind, args, tensors=(), block=True):
        """Send to the worker at `endpoint` (a DEALER of this thread, opened once). A send that cannot leave
        within lost_after s is AbortedError naming the peer (never for a best-effort `block=False` one)."""
        sock = self._peers.get(endpoint)
        if sock is None:
            sock = self._peers[endpoint] = _dealer(self.context, endpoint, self.lost_after, self.limits,
                                                   self._credentials)
        frames = wire.request_frames(kind, 0, {"rank": self.rank, "epoch": self.epoch, **args}, tensors)
        try:
            if block:
                wire.send_message(sock, frames)
            else:
                sock.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            if block:
                raise AbortedError(f"all-reduce: worker {self.rank} could not send {kind!r} to {endpoint} within "
                                   f"{self.lost_after:g} s") from None

    def close(self):
        """Stop beating, let queued chunks leave (a second), close the sockets and the context."""
        self._beats.stop()
        for sock in self._peers.values():
            sock.close(linger=1000)
        self.inbox.close(linger=0)
        curve.stop_authenticator(self.context)
        self.context.term()


def _dealer(context, endpoint, timeout, limits, credentials):
    sock = peer_socket(context, zmq.DEALER, timeout, limits)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    connect_peer(sock, endpoint, *credentials)
    return sock


class _Heartbeats:
    """A thread that sends `beat` to `targets` (endpoints) every lost_after / 5 s, on sockets of its own."""

    def __init__(self, link):
        self.link, self.targets = link, ()
        self.interval = min(1.0, max(0.05, link.lost_after / 5))
        self._stop = threading.Event()
        self._thread = None

    def start_once(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="ring-heartbeats")
            self._thread.start()

    def _run(self):
        link, socks = self.link, {}
        try:
            while not self._stop.wait(self.interval):
                targets = self.targets
                for endpoint in list(socks):
                    if endpoint not in targets:
                        socks.pop(endpoint).close(linger=0)
                for endpoint in targets:
                    if endpoint not in socks:
                        socks[endpoint] = _dealer(link.context, endpoint, link.lost_after, link.limits,
                                                  link._credentials)
                    try:
                        socks[endpoint].send_multipart(wire.request_frames(BEAT, 0, {"rank": link.rank}), zmq.NOBLOCK)
                    except zmq.Again:
                        pass    # a peer that does not read: the waits' clocks tell
        finally:
            for sock in socks.values():
                sock.close(linger=0)

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
