"""The queue-broker service: translates messages into calls on the queue registry.

All queue semantics live in `zmqflow.services.broker.queues`; this file only maps ops
to calls, parks requests that cannot complete yet, and replies to every ticket
a call completed (after the queue's loop finished, so replies are atomic). A leased
dequeue's reply carries its lease id; leases expire on the loop's timer and go back
when their client is gone (`on_client_gone`). A plain dequeue's answer that cannot be
delivered (its client vanished before the socket monitor said so) gives its elements back.
A queue's registered producers (queues/producers.py) are watched the same way: a producer
whose connection drops or whose beats stop past its lease fails its queue.
"""

import dataclasses
import logging
import time
from collections import deque

from zmqflow.common.errors import OK, OUT_OF_RANGE, UNAUTHENTICATED as MAX_CODE, DeadlineExceededError, InvalidArgumentError
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.common.memory import release_freed_memory
from zmqflow.common.rpc.service import PARKED, Service
from zmqflow.services.broker.queues import QueueDeclaration, QueueRegistry, Ticket
from zmqflow.services.broker.queues.leases import LeaseBook
from zmqflow.common.clients.producers import DEFAULT_REJOIN_S
from zmqflow.services.broker.queues.producers import ProducerBook
from zmqflow.services.broker.queues.quota import BrokerLimits
from zmqflow.common.wire.protocol import BrokerOps

log = logging.getLogger(__name__)

_TRIM_MIN_BYTES = 16 * 2 ** 20  # below this, what a trim could give back is not worth its pass over the heap



class BrokerService(Service):
    name = "queue-broker"
    protocol = BrokerOps

    def __init__(self, bind, limits=DEFAULT_LIMITS, client_timeout=30.0, context=None, broker_limits=None, **options):
        super().__init__(bind, limits, client_timeout, context, **options)
        self.broker_limits = broker_limits or BrokerLimits()
        self.registry = QueueRegistry(self.broker_limits)
        self.leases = LeaseBook()
        self.producers = ProducerBook()
        self._wake = None  # when the loop is woken next for an expiring lease or producer (monotonic s)
        self._trim_from = 0  # bytes held at the last trim, or the most since: housekeeping trims below half of it
        self.serve(dict.fromkeys(BrokerOps.QUEUE_OPS, self._queue_op))
        self.serve({BrokerOps.OpenQueue: self._open_queue, BrokerOps.AttachQueue: self._attach_queue,
                    BrokerOps.Size: self._size, BrokerOps.IsClosed: self._is_closed, BrokerOps.Reset: self._reset,
                    BrokerOps.ListQueues: self._list_queues, BrokerOps.Shutdown: self._shutdown,
                    BrokerOps.Ack: self._ack, BrokerOps.Nack: self._nack, BrokerOps.Extend: self._extend,
                    BrokerOps.RegisterProducer: self._register_producer, BrokerOps.Beat: self._beat,
                    BrokerOps.ProducerDone: self._producer_done, BrokerOps.ProducerFailed: self._producer_failed,
                    BrokerOps.Producers: self._producers})

    def _shutdown(self, call):
        """The chief says the job is over: exit 0, so compose and Kubernetes see it complete."""
        log.info("queue-broker shutting down (asked by %s)", call.args.by)
        self.stop()
        return {"queues": len(self.registry)}

    # ------------------------------------------------ queue requests

    def _queue_op(self, call):
        args = call.args
        queue = self.registry.get(args.queue)
        fields = args.__dict__  # the declaration's fields (protocol.Request.validate): n, lease, ... by op
        ticket = Ticket(call.op, call.tensors, fields.get("n"), fields.get("cancel_pending_enqueues", False),
                        call.identity, call, fields.get("lease"))
        call.state = (queue, ticket)
        completed = queue.submit(ticket)
        if not ticket.done:
            self.park(call)
        self._answer(completed)
        return PARKED

    @staticmethod
    def _take_back(queue, ticket):
        """A plain dequeue's answer could not be delivered (its client is gone): its elements go back, which may
        complete other waiting dequeues (returned)."""
        log.info("a %s answer could not be delivered (its client is gone): %d element(s) back in the queue",
                 ticket.op, len(ticket.handed))
        return queue.take_back(ticket)

    def _answer(self, tickets):
        tickets = deque(tickets)
        while tickets:
            ticket = tickets.popleft()
            call = ticket.tag
            if call is None:  # the broker's own close of a queue whose producers are done (producers.py)
                continue
            queue = call.state[0]  # before the answer: answering lets go of the call's state (rpc_service.Call)
            if ticket.error is not None:
                self.fail(call, ticket.error)
            elif ticket.lease is not None:
                self._answer_leased(call, queue, ticket)
            elif self.reply(call, None, ticket.result or ()) or not ticket.handed:
                ticket.handed = None
            else:  # its client is gone
                tickets.extend(self._take_back(queue, ticket))

    def _answer_leased(self, call, queue, ticket):
        """The elements stay the broker's until the lease is settled: the reply names the lease."""
        lease = self.leases.grant(queue, call.identity, ticket.leased or [], ticket.lease, time.monotonic())
        self._wake_by(lease.expires)
        self.reply(call, {"lease": lease.id, "lease_s": lease.seconds}, ticket.result or ())

    # ------------------------------------------------ leases (queues/leases.py)

    def _ack(self, call):
        lease, done = self.leases.ack(call.args.lease, call.identity)
        self._answer(done)
        return {"lease": lease.id, "acked": len(lease.elements)}

    def _nack(self, call):
        lease, done = self.leases.nack(call.args.lease, call.identity)
        self._answer(done)
        return {"lease": lease.id, "returned": len(lease.elements)}

    def _extend(self, call):
        lease = self.leases.extend(call.args.lease, call.identity, call.args.seconds, time.monotonic())
        self._wake_by(lease.expires)
        return {"lease": lease.id, "lease_s": lease.seconds}

    def _wake_by(self, when):
        """One wake-up for the earliest lease or producer expiry, not one per lease or beat: a timer per lease
        filled the deadline heap with one entry per leased batch for the lease's length."""
        if when is not None and (self._wake is None or when < self._wake):
            self._wake = when
            self.wake_at(when)

    def _expire(self, now):
        super()._expire(now)
        for book in (self.leases, self.producers):
            when = book.next_expiry
            if when is not None and when <= now:
                self._answer(book.expire(now))
        if self._wake is not None and self._wake <= now:  # that wake-up has come: set the next
            self._wake = None
            self._wake_by(min((t for t in (self.leases.next_expiry, self.producers.next_expiry) if t is not None),
                              default=None))

    def on_client_gone(self, identity, error):
        super().on_client_gone(identity, error)
        if self.leases:
            self._answer(self.leases.give_back_owner(identity))
        if self.producers:
            self._answer(self.producers.gone(identity, time.monotonic()))

    # ------------------------------------------------ producers (queues/producers.py)

    def _producer(self, call):
        """(queue, name) of a producer op; the name is bounded as the queues' names are."""
        if len(call.args.name) > self.limits.max_name_length:
            raise InvalidArgumentError(f"{call.op}'s name is longer than {self.limits.max_name_length} characters")
        return self.registry.get(call.args.queue), call.args.name

    def _register_producer(self, call):
        queue, name = self._producer(call)
        args = call.args
        source = None if args.source is None else self.registry.get(args.source)
        state = self.producers.register(queue, call.identity, name, args.lease, time.monotonic(), args.at_least_once,
                                        DEFAULT_REJOIN_S if args.rejoin_s is None else args.rejoin_s, source)
        self._wake_by(self.producers.next_expiry)
        log.info("producer %s registered on queue %r (%d producers)", name, queue.name, len(state["producers"]))
        return state

    def _beat(self, call):
        queue, name = self._producer(call)
        state = self.producers.beat(queue, call.identity, name, call.args.lease, call.args.progress, time.monotonic())
        self._wake_by(self.producers.next_expiry)
        return state

    def _producer_done(self, call):
        queue, name = self._producer(call)
        args = call.args
        state, done = self.producers.done(queue, call.identity, name, args.lease, args.exhausted, args.progress,
                                          time.monotonic())
        self._answer(done)
        self._wake_by(self.producers.next_expiry)
        return state

    def _producer_failed(self, call):
        queue, name = self._producer(call)
        if not OK < call.args.code <= MAX_CODE or call.args.code == OUT_OF_RANGE:  # OUT_OF_RANGE: a quiet end (§8)
            raise InvalidArgumentError(f"{call.op}'s error 'code' must be a status code, 1 to {MAX_CODE} but not "
                                       f"{OUT_OF_RANGE} (the end of input: producer_done), got {call.args.code}")
        state, done = self.producers.fail(queue, call.identity, name, call.args.code, call.args.error)
        self._answer(done)
        return state

    def _producers(self, call):
        return self.producers.state(self.registry.get(call.args.queue))

    def housekeeping(self, now):
        """Memory back to the system once what the broker holds has fallen to half or less of what it held at
        the last look (a queue drained at the end of input, a container reset): glibc keeps freed blocks in the
        process (common/memory.py), so the high-water mark would otherwise stay for the broker's lifetime."""
        freed, held = self.registry.shrink(), self.registry.quota.total_bytes
        if freed > _TRIM_MIN_BYTES or held * 2 <= self._trim_from and self._trim_from > _TRIM_MIN_BYTES:
            release_freed_memory()
            self._trim_from = held
        else:
            self._trim_from = max(self._trim_from, held)

    def keeps_state_for(self, identity):
        return self.leases.holds(identity) or self.producers.holds(identity)

    def on_deadline(self, call):
        self._withdraw(call, DeadlineExceededError("Timed out waiting for notification"))

    def on_cancel(self, call, error):
        self._withdraw(call, error)

    def _withdraw(self, call, error):
        queue, ticket = call.state
        completed = queue.cancel(ticket, error)
        if not completed and not call.finished:  # the queue no longer held it (container reset)
            self.fail(call, error)
        self._answer(completed)

    # ------------------------------------------------ registry requests

    def _open_queue(self, call):
        declaration = QueueDeclaration.from_dict(call.args.declaration)
        for field in ("shared_name", "container"):
            if len(getattr(declaration, field)) > self.limits.max_name_length:
                raise InvalidArgumentError(f"{field} longer than {self.limits.max_name_length} characters")
        handle, created = self.registry.open(declaration)
        queue = self.registry.get(handle)
        log.info("%s queue %r (handle %d)", "created" if created else "attached to", queue.name, handle)
        return {"handle": handle, "created": created, "name": queue.name}

    def _attach_queue(self, call):
        """Attach by name alone and learn the declaration (a broker extension: TF needs the declaration)."""
        handle = self.registry.find(call.args.container, call.args.shared_name)
        queue = self.registry.get(handle)
        return {"handle": handle, "created": False, "name": queue.name, "declaration": queue.decl.to_dict()}

    def _size(self, call):
        return {"size": self.registry.get(call.args.queue).size()}

    def _is_closed(self, call):
        return {"closed": self.registry.get(call.args.queue).is_closed()}

    def _reset(self, call):
        container = call.args.container
        before = len(self.registry.list())
        self._answer(self.registry.reset(container))
        self.leases.forget_freed_queues()
        self.producers.forget_freed_queues()
        return {"container": container, "freed": before - len(self.registry.list())}

    def _list_queues(self, call):
        return {"queues": self.registry.list()}

    def metric_families(self):
        """Queue gauges for Prometheus, read from the registry at scrape time (common/processes/metrics.py)."""
        from zmqflow.common.processes.metrics import gauge_family
        queues, labels = self.registry.list(), ("container", "queue", "kind")
        for field, name, doc in (("size", "queue_size", "Elements in the queue."),
                                 ("capacity", "queue_capacity", "The queue's capacity (-1: unbounded)."),
                                 ("waiting_enqueues", "waiting_enqueues", "Enqueue requests parked for room."),
                                 ("waiting_dequeues", "waiting_dequeues", "Dequeue requests parked for elements."),
                                 ("bytes", "queue_bytes", "Element bytes the queue holds."),
                                 ("leased", "queue_leased", "Elements out on leases not settled yet."),
                                 ("closed", "queue_closed", "1 once the queue is closed.")):
            yield gauge_family(f"zmqflow_broker_{name}", doc,
                               {(q["container"], q["shared_name"], q["kind"]): int(q[field]) for q in queues}, labels)
        yield gauge_family("zmqflow_broker_queues", "Queues the broker holds.", len(self.registry))
        yield from self._lease_families()
        yield gauge_family("zmqflow_broker_held_bytes", "Element bytes held by all queues.",
                           self.registry.quota.total_bytes)

    def _lease_families(self):
        from zmqflow.common.processes.metrics import counter_family, gauge_family
        counts = self.leases.counts
        yield counter_family("zmqflow_broker_leases", "Leased dequeues answered.", counts["leases"])
        yield counter_family("zmqflow_broker_leased_elements", "Elements handed out on a lease.", counts["leased"])
        yield counter_family("zmqflow_broker_acked_elements", "Leased elements acknowledged (gone for good).",
                             counts["acked"])
        yield counter_family("zmqflow_broker_returned_elements", "Leased elements given back to their queue, by why.",
                             {(why,): counts[why] for why in ("expired", "nacked", "client_gone")}, ("reason",))
        yield gauge_family("zmqflow_broker_open_leases", "Leases not settled yet.", len(self.leases))

    def describe(self):
        return {"queues": len(self.registry), "bytes": self.registry.quota.total_bytes,
                "limits": dataclasses.asdict(self.broker_limits),
                "leases": {"open": len(self.leases), **self.leases.counts}}
