"""The close protocol: reader processes agree, over the broker alone, on when the instance queue closes.

Why: several reader services (each with several reader threads) push into one
instance queue. It must be closed exactly once, after the last instance of the
last reader is in: no instance lost, no early close while another reader still
pushes, no reader left waiting. A reader that dies mid-file must become an error
for the consumers, not a queue that never closes or that closes early as if the
data had ended. There is no coordinator process: the broker is all they share.

The record. A pipeline is named after its instance queue `Q`. It keeps one JSON
document, its record, as the only element of a capacity-1 FIFOQueue `Q.pipeline`
in the same container. The element is a token: a participant dequeues it (which
gives it exclusive access, like a mutex), changes the record and enqueues it
back. The one whose open_queue created `Q.pipeline` (the broker says so) puts the
first, blank record in. The record holds
    members   {member id: {pid, host, lease_s, beat, done, progress}}: the reader processes that joined
    producer  the member running string_input_producer on `Q.filenames` (the first to join)
    closed    None, "ok" or "failed"; closed_by; the failure's status code and message

Rules (a member is a reader process; its threads act through it):
1. join before taking any file name. A pipeline already closed is not joined (its
   work is done); a failed one is the recorded error.
2. finish once the member's reader threads stopped taking file names and its last
   enqueue_many was acknowledged; it is `exhausted` when they all saw OutOfRange on
   the file-name queue (the producer had closed it and each name was taken by some
   member), not when it was stopped between files. The member whose finish leaves
   no member unfinished decides, holding the token: if some member was exhausted,
   every name was taken and every taker finished, so it closes the instance queue
   and records closed = "ok"; if none was (every reader left early), the rest of
   the input would be lost, so it fails the pipeline (CancelledError). Exactly once,
   since only the token holder decides, and only when no member that could still
   push is left: one that joined earlier is counted, one joining later finds the
   pipeline closed (and the file names all taken).
3. beat: every lease_s / 4 a member increments its beat counter and reports its
   progress. Every participant (members, and consumers through PipelineWatch)
   remembers by its own clock when it last saw each unfinished member's counter
   change; silent longer than that member's lease_s means dead (killed mid-file,
   host gone). No clocks are compared across machines.
4. fail: a participant that finds a dead member, or a member whose reader hit an
   error (a corrupt file, SIGTERM mid-file), records closed = "failed" with the
   error's status code and message, and closes the instance and file-name queues
   with cancel_pending_enqueues: no reader stays blocked, consumers reach
   OutOfRange, and `raise_if_failed` / PipelineWatch turn that OutOfRange into the
   recorded error (AbortedError naming the dead member and the file it was reading).
5. the token: a participant killed while holding it (a window of two round trips
   per beat) loses it. The others wait at most `token_wait_s` for it, then close
   the queues with cancel and report AbortedError("record lost"). Either way the
   consumers get an error, never a silently short epoch.

At-least-once mode (`at_least_once`, recorded by the first member; every member must
agree). Readers take file names with a lease (docs/queues.md), extended while they read,
and ack a name only after the file's last enqueue_many was acknowledged. A closed
file-name queue then answers OutOfRange only when no name is stored or leased, so
`exhausted` means every file was read to its end. Rules 3 and 4 change for a member
that stops beating: it is dropped from the record instead of failing it; its name came
back to the queue when its connection dropped (or its lease expired), and another or a
restarted member reads the whole file again (its rows arrive twice: at least once). If
the members left are all done and one was exhausted, the dropping participant closes the
instance queue. With no unfinished member left and the input not exhausted, the pipeline
waits `rejoin_s` (recorded by the first member) for a reader to join again; a consumer
watching it then fails it (AbortedError). The producer pushes every name at once
(the file-name queue holds them all), so it is done within moments; a producer killed
before it closed the names still fails the pipeline, as does a reader's own error.
Rule 5 holds in both modes with a lease on the token: a participant killed while
holding it gives it back at once (its change is lost, the record is not); only a death
between sending the token's ack and sending the record back (microseconds: both leave
together, in order) loses the record.

A consumer using the queue directly, TensorFlow style, sees OutOfRange after a
failure too: calling `raise_if_failed` on OutOfRange, or dequeuing through
PipelineWatch, gives it the error. A closed pipeline stays closed (queues cannot
reopen): run again under another queue name, or reset the container.

`PipelineRecord` and `LeaseWatch` are plain code; `PipelineRegister`,
`Coordinator` and `PipelineWatch` talk to the broker.
"""

import itertools
import json
import logging
import os
import socket
import time

from zmqflow.common import queues
from zmqflow.common.errors import (ABORTED, CANCELLED, AbortedError, CancelledError, DeadlineExceededError,
                           FailedPreconditionError, InvalidArgumentError, NotFoundError, OpError, OutOfRangeError,
                           error_from_code)
from zmqflow.common.rpc_client import default_pool

log = logging.getLogger(__name__)

RECORD_SUFFIX = ".pipeline"
FILENAMES_SUFFIX = ".filenames"
DEFAULT_LEASE_S = 3.5   # a member silent this long is dead: consumers and members notice within 5 s (+ a look, 0.5 s)
DEFAULT_TOKEN_WAIT_S = 10.0
DEFAULT_REJOIN_S = 30.0  # at-least-once: how long consumers wait for a reader when every member is gone
TOKEN_LEASE_S = 120.0    # longer than any change made holding the token (a close waits at most 30 s)


_MEMBERS_HERE = itertools.count(1)


def member_id(name="reader"):
    """A name unique across hosts and restarts: 'name@host:pid', then 'name@host:pid#2', ... for more
    members in one process."""
    n = next(_MEMBERS_HERE)
    return f"{name}@{socket.gethostname()}:{os.getpid()}" + (f"#{n}" if n > 1 else "")


# ------------------------------------------------------------------ plain code


class PipelineRecord:
    """The shared record of one pipeline; changed only by the token's holder."""

    def __init__(self, doc=None):
        self.doc = doc or {"members": {}, "producer": None, "closed": None, "closed_by": None,
                           "code": 0, "error": None}

    @classmethod
    def decode(cls, raw):
        return cls(json.loads(raw.decode() if isinstance(raw, bytes) else raw))

    def encode(self):
        return json.dumps(self.doc, separators=(",", ":")).encode()

    @property
    def members(self):
        return self.doc["members"]

    @property
    def producer(self):
        return self.doc["producer"]

    @property
    def closed(self):
        return self.doc["closed"]

    @property
    def failed(self):
        return self.doc["closed"] == "failed"

    @property
    def at_least_once(self):
        return bool(self.doc.get("at_least_once"))

    @property
    def rejoin_s(self):
        return self.doc.get("rejoin_s") or DEFAULT_REJOIN_S

    def error(self):
        """The recorded failure as the exception a consumer raises, or None."""
        return error_from_code(self.doc["code"], self.doc["error"]) if self.failed else None

    def join(self, member, info):
        """Add `member`; True when the pipeline is open. A failed pipeline raises its error."""
        if self.failed:
            raise self.error()
        if self.closed:
            return False
        if member in self.members:
            raise AbortedError(f"member {member!r} joined pipeline twice")
        mode = bool(info.get("at_least_once"))
        if "at_least_once" not in self.doc:   # the first member sets the pipeline's mode
            self.doc.update(at_least_once=mode, rejoin_s=info.get("rejoin_s") or DEFAULT_REJOIN_S)
        elif mode != self.at_least_once:
            raise InvalidArgumentError(
                f"reader {member} is {'' if mode else 'not '}at-least-once, the pipeline's first reader was "
                f"{'' if self.at_least_once else 'not'}: start every reader of a pipeline with the same mode")
        self.members[member] = {**info, "beat": 0, "done": False, "progress": {}}
        if self.doc["producer"] is None:
            self.doc["producer"] = member
        return True

    def beat(self, member, progress=None):
        entry = self.members.get(member)
        if entry is not None:
            entry["beat"] += 1
            if progress is not None:
                entry["progress"] = progress

    def finish(self, member, progress=None, exhausted=True):
        """Mark `member` done; 'close' or 'fail' when the caller must end the pipeline now, else None."""
        entry = self.members[member]
        entry.update(done=True, exhausted=bool(exhausted))
        if progress is not None:
            entry["progress"] = progress
        return self.decision()

    def decision(self):
        """'close' when every member is done and one saw the names exhausted; 'fail' when every member
        is done and none did (at-least-once: None, a reader may join again); else None."""
        if self.closed is not None or not self.members or not all(m["done"] for m in self.members.values()):
            return None
        if any(m.get("exhausted") for m in self.members.values()):
            return "close"
        return None if self.at_least_once else "fail"

    def drop(self, member):
        """At-least-once: forget a dead member (its leased file name went back to the queue)."""
        self.members.pop(member, None)

    def rejoin(self, member, info):
        """At-least-once: a member dropped as dead that beats again (it was only slow) is a member again,
        while the pipeline is open. True when it was re-added."""
        if member in self.members or not self.at_least_once or self.closed is not None:
            return False
        self.members[member] = {**info, "beat": 0, "done": False, "progress": {}}
        return True

    def orphaned(self):
        """At-least-once, open, and no unfinished member left to read what is left."""
        return self.at_least_once and self.closed is None and not self.unfinished()

    def mark_closed(self, member):
        self.doc.update(closed="ok", closed_by=member)

    def fail(self, member, code, message):
        """Record a failure; False (nothing changes) when the pipeline is already closed or failed."""
        if self.closed is not None:
            return False
        self.doc.update(closed="failed", closed_by=member, code=int(code), error=str(message))
        return True

    def unfinished(self):
        return {m: e for m, e in self.members.items() if not e["done"]}


class LeaseWatch:
    """One participant's view of the members' beats, timed by its own clock only."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._seen = {}  # member -> (beat, when it was first seen at that beat)

    def dead(self, record, me=None):
        """[(member, seconds silent)] of unfinished members whose beat stood still past their lease."""
        now, dead = self.clock(), []
        for member, entry in record.members.items():
            if entry["done"] or member == me:
                self._seen.pop(member, None)
                continue
            seen = self._seen.get(member)
            if seen is None or seen[0] != entry["beat"]:
                self._seen[member] = (entry["beat"], now)
            elif now - seen[1] > entry["lease_s"]:
                dead.append((member, now - seen[1]))
        return dead


def describe_dead(record, dead):
    """The failure message for members found dead: who, how long silent, what they were reading."""
    parts = []
    for member, silent in dead:
        entry = record.members[member]
        progress = entry.get("progress") or {}
        reading = progress.get("reading") or []
        where = f"while reading {', '.join(reading)}" if reading else "between files"
        parts.append(f"reader {member} stopped beating for {silent:.1f} s (lease {entry['lease_s']} s) {where}; "
                     f"it had pushed {progress.get('instances', 0)} instances of {progress.get('files_done', 0)} "
                     f"finished files")
    return "; ".join(parts)


# ------------------------------------------------------------------ over the broker


class PipelineRegister:
    """The record's token on the broker: `update(fn)` takes it, runs fn(record), puts it back."""

    def __init__(self, broker, pipeline, container="", create=True, token_wait_s=DEFAULT_TOKEN_WAIT_S, pool=None):
        self.name = pipeline + RECORD_SUFFIX
        self.token_wait_s = token_wait_s
        self.lost = None
        pool = pool or default_pool
        created = False
        if create:
            declaration = {"kind": "FIFOQueue", "capacity": 1, "dtypes": ["string"], "shapes": [[]], "names": None,
                           "shared_name": self.name, "container": container}
            created = queues.open_queue(declaration, broker, pool, timeout=token_wait_s)["created"]
        self.queue = queues.attach(self.name, container, broker, pool, timeout=0.0 if not create else token_wait_s)
        if created:
            self.queue.enqueue(PipelineRecord().encode(), timeout=token_wait_s)

    @classmethod
    def find(cls, broker, pipeline, container="", token_wait_s=DEFAULT_TOKEN_WAIT_S, pool=None):
        """The register of an existing pipeline, or None when no reader ever joined one of that name."""
        try:
            return cls(broker, pipeline, container, create=False, token_wait_s=token_wait_s, pool=pool)
        except NotFoundError:
            return None

    def update(self, fn):
        """fn(record) with the token held; the (possibly changed) record goes back even if fn raises.
        A token not handed back within token_wait_s is lost for good: this and every later call raise."""
        if self.lost is not None:
            raise self.lost
        taken = time.monotonic()
        try:
            token = self.queue.dequeue(timeout=self.token_wait_s, lease=TOKEN_LEASE_S)
        except DeadlineExceededError:
            self.lost = AbortedError(f"pipeline record {self.name!r} was not handed back within {self.token_wait_s} "
                                     "s: a participant died holding it, so the pipeline's state is lost")
            raise self.lost from None
        record = PipelineRecord.decode(token.values.item())
        try:
            return fn(record)
        finally:
            self._hand_back(token, record, time.monotonic() - taken)

    def _hand_back(self, token, record, held_s):
        """Ack the token taken (so it cannot come back), then put the changed record in its place.

        Held well within its lease, the ack and the put leave together: the broker takes them in
        order, and a holder killed between them (microseconds, not a round trip) loses the record.
        Held longer, the lease may have run out and the token gone to another participant: then
        the ack is awaited first, and a refused one drops this change instead of adding a record."""
        if held_s < TOKEN_LEASE_S / 2:
            ack = token.ack_async(timeout=self.token_wait_s)
            put = self.queue.enqueue_async(record.encode(), timeout=self.token_wait_s)
            put.result()
            try:
                ack.result()
            except OpError as exc:   # given back before the ack (its client taken for gone): say so
                self.lost = AbortedError(f"pipeline record {self.name!r} was given back while this participant "
                                         f"held it ({exc}); the pipeline's state can no longer be trusted")
                raise self.lost from None
            return
        try:
            token.ack(timeout=self.token_wait_s)
        except FailedPreconditionError as exc:
            self.lost = AbortedError(f"pipeline record {self.name!r} was held past its {TOKEN_LEASE_S:.0f} s lease "
                                     f"and went back to the others; this participant's change is dropped ({exc})")
            raise self.lost from None
        self.queue.enqueue(record.encode(), timeout=self.token_wait_s)

    def read(self):
        """A snapshot of the record."""
        return self.update(lambda record: PipelineRecord(json.loads(record.encode())))


def close_with_cancel(queue_list):
    """Close each queue with cancel_pending_enqueues (idempotent); errors are logged, not raised."""
    for queue in queue_list:
        if queue is None:
            continue
        try:
            queue.close(cancel_pending_enqueues=True, timeout=5.0)
        except OpError as exc:
            log.warning("closing %r with cancel failed: %s", getattr(queue, "name", queue), exc)


class Coordinator:
    """One member's side of the protocol: join, beat (and watch the others), finish, fail."""

    def __init__(self, register, instance_queue, filename_queue, member, lease_s=DEFAULT_LEASE_S,
                 at_least_once=False, rejoin_s=DEFAULT_REJOIN_S):
        self.register, self.instance_queue, self.filename_queue = register, instance_queue, filename_queue
        self.member, self.lease_s = member, lease_s
        self.at_least_once, self.rejoin_s = at_least_once, rejoin_s
        self.watch = LeaseWatch()
        self._info = {"lease_s": lease_s}   # what this member joined with (join() completes it)

    def join(self, info=None):
        """'producer' | 'reader' | 'closed' (already finished: nothing to do); a failed pipeline raises."""
        info = {"pid": os.getpid(), "host": socket.gethostname(), "lease_s": self.lease_s,
                "at_least_once": self.at_least_once, "rejoin_s": self.rejoin_s, **(info or {})}
        self._info = info

        def join(record):
            if not record.join(self.member, info):
                return "closed"
            return "producer" if record.producer == self.member else "reader"
        return self.register.update(join)

    def beat(self, progress=None):
        """Beat, and fail the pipeline if another member stopped beating; returns the record."""
        def beat(record):
            self._rejoin_if_dropped(record)
            record.beat(self.member, progress)
            if record.closed is None:
                dead = self.watch.dead(record, me=self.member)
                if dead:
                    self.dead_found_locked(record, dead)
            return PipelineRecord(json.loads(record.encode()))
        return self.register.update(beat)

    def finish(self, progress=None, exhausted=True):
        """Mark this member done (`exhausted`: its readers saw the end of the file names); the last one
        closes the instance queue, or fails the pipeline if no member saw the end. Returns the record."""
        def finish(record):
            self._rejoin_if_dropped(record)
            if self.member not in record.members:    # dropped, and the pipeline closed meanwhile: nothing to do
                return PipelineRecord(json.loads(record.encode()))
            decision = record.finish(self.member, progress, exhausted)
            if decision == "fail":
                self.fail_locked(record, CANCELLED, f"every reader left before the input was exhausted (the last "
                                                    f"was {self.member}): the rest of the input would be lost")
            elif decision == "close":
                self.close_locked(record)
            return PipelineRecord(json.loads(record.encode()))
        return self.register.update(finish)

    def _rejoin_if_dropped(self, record):
        if record.rejoin(self.member, self._info):
            log.warning("%s was taken for dead (silent past its %g s lease) and dropped; it beats again, so it "
                        "is a member again", self.member, self.lease_s)

    def close_locked(self, record):
        """Close the instance queue (the input is all in) and record it; a close that fails fails the pipeline."""
        try:
            self.instance_queue.close(timeout=30.0)
        except CancelledError:
            log.warning("instance queue %r was already closed by someone else", self.instance_queue.name)
        except OpError as exc:  # not closed (an outside enqueue holds it up): never leave it open
            self.fail_locked(record, exc.code, f"closing the instance queue failed: {exc}")
            return
        record.mark_closed(self.member)
        log.info("every member finished: %s closed the instance queue %r", self.member, self.instance_queue.name)

    def dead_found_locked(self, record, dead):
        """Members that stopped beating: the pipeline fails, or in at-least-once mode they are dropped (their
        file names came back to the queue) unless the dead one is the producer before it closed the names."""
        message = describe_dead(record, dead)
        if not record.at_least_once or self._producer_unfinished(record, dead):
            self.fail_locked(record, ABORTED, message)
            return
        for member, _ in dead:
            record.drop(member)
        log.warning("%s; dropped from the pipeline: its file name went back to the queue and is read again "
                    "(at least once)", message)
        if record.decision() == "close":
            self.close_locked(record)

    def _producer_unfinished(self, record, dead):
        if record.producer not in {member for member, _ in dead}:
            return False
        try:
            return not self.filename_queue.is_closed()
        except (AttributeError, OpError):   # no file-name queue to look at: take the names as unfinished
            return True

    def fail(self, error):
        """Record `error` (an OpError or any exception) as the pipeline's failure and close its queues
        with cancel. False when it had already closed or failed. Works without the record too."""
        code = getattr(error, "code", ABORTED)
        message = str(error) or type(error).__name__
        try:
            return self.register.update(lambda record: self.fail_locked(record, code, message))
        except OpError as exc:  # the record is lost or the broker is gone: still unblock everyone
            log.error("could not record the failure (%s); closing the queues with cancel", exc)
            close_with_cancel([self.filename_queue, self.instance_queue])
            return True

    def fail_locked(self, record, code, message):
        if not record.fail(self.member, code, message):
            return False
        (log.warning if code == CANCELLED else log.error)("pipeline failed: %s", message)
        close_with_cancel([self.filename_queue, self.instance_queue])
        return True


def raise_if_failed(queue, container="", pool=None, token_wait_s=DEFAULT_TOKEN_WAIT_S):
    """Raise the failure recorded for the pipeline feeding `queue` (a queue object in `container`).

    Call it on OutOfRange to tell the end of the data from a failed input pipeline;
    it returns quietly when the pipeline ended well or no reader pipeline feeds `queue`."""
    register = PipelineRegister.find(queue.broker, queue.name, container, token_wait_s, pool)
    if register is None:
        return
    error = register.read().error()
    if error is not None:
        raise error


def _attach_or_none(name, container, broker, pool):
    try:
        return queues.attach(name, container, broker, pool, timeout=0.0)
    except NotFoundError:
        return None


class PipelineWatch:
    """The consumer's side: dequeue from a pipeline's instance queue and get its errors.

    Each dequeue waits in slices of `poll_s`; between slices it beats no one but
    watches the members' beats (a consumer can find every reader dead), and on
    OutOfRange it reads the record, raising the pipeline's error if it failed. A consumer
    that is never kept waiting (the queue still holds what a dead reader pushed) also looks
    at the beats every `look_every_s`, before a dequeue: a beat is timed from when a
    consumer saw it change, so looking only once starved would add the time to drain the
    queue to the lease. A dead reader is so found within its lease + about 0.5 s.
    `timeout` bounds the whole call (DeadlineExceededError, nothing consumed).
    """

    def __init__(self, queue, container="", poll_s=0.5, token_wait_s=DEFAULT_TOKEN_WAIT_S, pool=None,
                 look_every_s=0.5):
        self.queue, self.container, self.poll_s, self.look_every_s = queue, container, poll_s, look_every_s
        self._looked = time.monotonic()
        self.token_wait_s, self.pool = token_wait_s, pool
        self.watch = LeaseWatch()
        self._register = None
        self._orphaned_since = None   # at-least-once: since when (this consumer's clock) no member is left

    def register(self):
        if self._register is None:
            self._register = PipelineRegister.find(self.queue.broker, self.queue.name, self.container,
                                                   self.token_wait_s, self.pool)
        return self._register

    def check(self):
        """Raise the pipeline's error if it failed, or fail it if a member stopped beating."""
        self._looked = time.monotonic()
        register = self.register()
        if register is None:
            return

        def look(record):
            if record.closed is None:
                dead = self.watch.dead(record)
                if dead:
                    self._consumer(register).dead_found_locked(record, dead)
                self._check_orphaned(register, record)
            return record.error()
        error = register.update(look)
        if error is not None:
            raise error

    def look_if_due(self):
        """check(), when look_every_s has passed since the last look."""
        if time.monotonic() - self._looked >= self.look_every_s:
            self.check()

    def _consumer(self, register):
        """This consumer as a participant that may fail, drop members or close (it joins nothing)."""
        filenames = _attach_or_none(self.queue.name + FILENAMES_SUFFIX, self.container, self.queue.broker, self.pool)
        return Coordinator(register, self.queue, filenames, member=member_id("consumer"))

    def _check_orphaned(self, register, record):
        """At-least-once: with no unfinished member left, wait the record's rejoin_s for a reader, then fail."""
        if not record.orphaned():
            self._orphaned_since = None
            return
        now = time.monotonic()
        self._orphaned_since = self._orphaned_since or now
        if now - self._orphaned_since > record.rejoin_s:
            self._consumer(register).fail_locked(
                record, ABORTED, f"pipeline {self.queue.name!r} has no live reader left and its input is not "
                                 f"exhausted; none joined again within {record.rejoin_s:g} s")

    def _dequeue(self, method, args, timeout):
        deadline = None if timeout is None else time.monotonic() + timeout
        self.look_if_due()
        while True:
            wait = self.poll_s if deadline is None else min(self.poll_s, max(0.0, deadline - time.monotonic()))
            try:
                return getattr(self.queue, method)(*args, timeout=wait)
            except DeadlineExceededError:
                self.check()
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            except OutOfRangeError:
                self.check()
                raise

    def dequeue(self, timeout=None):
        return self._dequeue("dequeue", (), timeout)

    def dequeue_many(self, n, timeout=None):
        return self._dequeue("dequeue_many", (n,), timeout)

    def dequeue_up_to(self, n, timeout=None):
        return self._dequeue("dequeue_up_to", (n,), timeout)
