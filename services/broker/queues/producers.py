"""Producers registered on a queue: the broker owns the end of their input and their liveness.

zmqflow's extension beyond TensorFlow (docs/queue-semantics.md §8), in the way of the zguide's
Majordomo broker: producers do not watch each other through shared state; each tells the broker it
is alive (a beat within its lease), done, or failed, and the broker, which sees every client's
connection, decides for the queue:
- the last registered producer to say done closes it (TF's last queue runner did), provided one of
  them saw its input exhausted; if none did, every producer left early and the rest of the input
  would be lost: the queue fails (Cancelled);
- a producer that vanishes before it is done (its connection dropped, or silent past its lease)
  fails it (Aborted, naming the producer and what it was reading); a producer's own error fails it;
- at-least-once input (the first producer's mode; every producer must agree): a vanished producer
  is dropped instead, since what it held (its leased file name) went back to the source queue for
  another; one dropped while only slow is a producer again at its next beat. With no unfinished
  producer left and the input not exhausted, the queue waits `rejoin_s` for one, then fails. The
  first producer vanishing before the source queue (the file names it feeds) was closed still fails.
A failed queue fails its source queue too (QueueBase.fail). Plain logic, no sockets: the server maps
the producer ops, lost clients and its timer to these calls and answers the tickets they complete.
"""

from zmqflow.common.errors import (ABORTED, CANCELLED, FailedPreconditionError, InvalidArgumentError, NotFoundError,
                                   error_from_code)
from zmqflow.common.clients.producers import DEFAULT_REJOIN_S
from zmqflow.services.broker.queues.ticket import Ticket


class Producer:
    """One registered producer: its client, lease, last beat and what it reported."""

    __slots__ = ("name", "owner", "lease_s", "beat_at", "done", "exhausted", "progress")

    def __init__(self, name, owner, lease_s, now):
        self.name, self.owner, self.lease_s, self.beat_at = name, owner, lease_s, now
        self.done = self.exhausted = False
        self.progress = {}

    @property
    def expires(self):
        return self.beat_at + self.lease_s

    def vanished(self, now, why):
        """The failure it causes: who, how long silent, what it was reading and had pushed."""
        progress = self.progress
        reading = progress.get("reading") or []
        where = f"while reading {', '.join(map(str, reading))}" if reading else "between files"
        return (f"{self.name} stopped beating for {now - self.beat_at:.1f} s ({why}; lease {self.lease_s:g} s) "
                f"{where}; it had pushed {progress.get('instances', 0)} instances of "
                f"{progress.get('files_done', 0)} finished files")


class QueueProducers:
    """The producers of one queue and how its input ended: closed None, 'ok' or 'failed'."""

    def __init__(self, queue, at_least_once, rejoin_s, source):
        self.queue, self.source = queue, source
        self.at_least_once, self.rejoin_s = at_least_once, rejoin_s
        self.producers = {}   # name -> Producer, in registration order
        self.first = None     # the first producer's name (a reader pipeline's: it feeds the source queue)
        self.closed = self.closed_by = self.error = None
        self.code = 0
        self.rejoin_by = None   # at-least-once, every producer gone: when the wait for one ends

    def unfinished(self):
        return [p for p in self.producers.values() if not p.done]

    def state(self):
        """What the producer ops answer (and `producers` shows): JSON-able."""
        return {"queue": self.queue.name, "closed": self.closed, "closed_by": self.closed_by, "code": self.code,
                "error": self.error, "at_least_once": self.at_least_once, "first": self.first,
                "producers": {p.name: {"done": p.done, "exhausted": p.exhausted, "lease_s": p.lease_s,
                                       "progress": p.progress} for p in self.producers.values()}}


class ProducerBook:
    """Every queue's registered producers; `next_expiry` says when the server's timer must call `expire`."""

    def __init__(self):
        self._queues = {}   # queue -> QueueProducers
        self.next_expiry = None

    def __len__(self):
        return len(self._queues)

    def state(self, queue):
        return self._entry(queue).state()

    # ------------------------------------------------ what producers say

    def register(self, queue, owner, name, lease_s, now, at_least_once=False, rejoin_s=DEFAULT_REJOIN_S,
                 source=None):
        """Add a producer; the queue's state. A queue whose producers failed raises that failure; one
        they closed answers closed 'ok' (nothing left to produce) without registering."""
        entry = self._queues.get(queue)
        if entry is None:
            entry = self._queues[queue] = QueueProducers(queue, at_least_once, rejoin_s, source)
        if entry.closed == "failed":
            raise error_from_code(entry.code, entry.error)
        if entry.closed is None:
            if at_least_once != entry.at_least_once:
                raise InvalidArgumentError(
                    f"producer {name} is {'' if at_least_once else 'not '}at-least-once, the first producer of "
                    f"queue '{queue.name}' was {'' if entry.at_least_once else 'not'}: start every producer of a "
                    "queue in the same mode")
            if name in entry.producers:
                raise InvalidArgumentError(f"producer {name!r} is already registered on queue '{queue.name}'")
            entry.producers[name] = Producer(name, owner, lease_s, now)
            entry.first = entry.first or name
            entry.rejoin_by = None
            self._plan()
        return entry.state()

    def beat(self, queue, owner, name, lease_s, progress, now):
        """The producer is alive (and reports `progress`); the queue's state."""
        entry = self._entry(queue)
        producer = self._producer(entry, owner, name, lease_s, now)
        if producer is not None:
            producer.beat_at = now
            if progress is not None:
                producer.progress = progress
            self._plan()
        return entry.state()

    def done(self, queue, owner, name, lease_s, exhausted, progress, now):
        """The producer pushed its last element (`exhausted`: it saw its input's end); (state, completed
        tickets): the last one done closes the queue, or fails it when none saw the end."""
        entry = self._entry(queue)
        producer = self._producer(entry, owner, name, lease_s, now)
        if producer is None:
            return entry.state(), []
        producer.done, producer.exhausted = True, bool(exhausted)
        if progress is not None:
            producer.progress = progress
        done = self._decide(entry, name, now)
        return entry.state(), done

    def fail(self, queue, owner, name, code, message):
        """A producer's own error (a corrupt file, a stop mid-file) fails the queue; (state, tickets)."""
        entry = self._entry(queue)
        done = [] if entry.closed is not None else self._fail(entry, name, code, message)
        return entry.state(), done

    # ------------------------------------------------ what the broker sees

    def gone(self, owner, now):
        """A client is gone (its connection dropped, or bye): its unfinished producers vanished."""
        done = []
        for entry in list(self._queues.values()):
            for producer in [p for p in entry.unfinished() if p.owner == owner]:
                done.extend(self._vanish(entry, producer, now, "its connection dropped"))
        return done

    def expire(self, now):
        """Producers silent past their lease vanished; at-least-once queues past their rejoin wait fail."""
        done = []
        for entry in list(self._queues.values()):
            if entry.closed is not None:
                continue
            for producer in [p for p in entry.unfinished() if p.expires <= now]:
                done.extend(self._vanish(entry, producer, now, "silent past its lease"))
            if entry.closed is None and entry.rejoin_by is not None and entry.rejoin_by <= now:
                done.extend(self._fail(entry, "broker", ABORTED, (
                    f"queue '{entry.queue.name}' has no live reader left and its input is not exhausted: every "
                    f"producer is gone, and none joined again within {entry.rejoin_s:g} s")))
        self._plan()
        return done

    def holds(self, owner):
        """Whether `owner` is an unfinished producer (its connection must stay watched)."""
        return any(p.owner == owner for entry in self._queues.values() for p in entry.unfinished())

    def forget_freed_queues(self):
        """Drop the producers of queues a container reset freed."""
        for queue in [q for q in self._queues if q.freed]:
            del self._queues[queue]
        self._plan()

    # ------------------------------------------------ decisions

    def _entry(self, queue):
        entry = self._queues.get(queue)
        if entry is None:
            raise NotFoundError(f"no producer ever registered on queue '{queue.name}'")
        return entry

    def _producer(self, entry, owner, name, lease_s, now):
        """The producer `name`, now on `owner`'s connection (a reconnect changes it). An at-least-once one
        dropped while only slow is added again while the queue is open; None once the queue is closed."""
        producer = entry.producers.get(name)
        if producer is None:
            if entry.closed is not None:
                return None
            if not entry.at_least_once:
                raise FailedPreconditionError(f"{name} is not a producer of queue '{entry.queue.name}': register first")
            producer = entry.producers[name] = Producer(name, owner, lease_s, now)
            entry.rejoin_by = None
        producer.owner = owner
        return producer

    def _vanish(self, entry, producer, now, why):
        """A producer gone before it was done: the queue fails, or (at least once) it is dropped."""
        message = producer.vanished(now, why)
        names_open = producer.name == entry.first and not (entry.source is not None and entry.source.is_closed())
        if not entry.at_least_once or names_open:
            return self._fail(entry, "broker", ABORTED, message)
        del entry.producers[producer.name]
        return self._decide(entry, "broker", now)

    def _decide(self, entry, by, now):
        """With no unfinished producer left: close if one saw the end; else fail, or (at least once) wait."""
        if entry.closed is not None or entry.unfinished():
            return []
        if any(p.exhausted for p in entry.producers.values()):
            entry.closed, entry.closed_by = "ok", by
            self._plan()
            return entry.queue.submit(Ticket("close"))  # behind any outside enqueue still pending (§3)
        if entry.at_least_once:
            entry.rejoin_by = entry.rejoin_by or now + entry.rejoin_s
            self._plan()
            return []
        return self._fail(entry, by, CANCELLED, f"every producer left before the input was exhausted (the last was "
                                                f"{by}): the rest of the input would be lost")

    def _fail(self, entry, by, code, message):
        entry.closed, entry.closed_by, entry.code, entry.error = "failed", by, int(code), str(message)
        error = error_from_code(entry.code, entry.error)
        done = entry.queue.fail(error)
        if entry.source is not None and not entry.source.freed:
            done.extend(entry.source.fail(error))
        self._plan()
        return done

    def _plan(self):
        times = [t for entry in self._queues.values() if entry.closed is None
                 for t in [p.expires for p in entry.unfinished()] + [entry.rejoin_by] if t is not None]
        self.next_expiry = min(times) if times else None
