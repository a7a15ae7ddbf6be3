"""At-least-once input for a worker: its leased batches, acked only once their gradients are on the ps.

A worker with `--at-least-once` dequeues each batch with a lease (docs/queues.md). The broker
keeps the batch until the ack, which comes only after the step's push was acknowledged by the
ps (async: when that push is settled; sync: when the push is answered, before the wait for the
other replicas, which at the end of the input may be waiting for this very batch to be acked
or come back), so a worker killed mid-step
gives back what it held (the batch in hand, the prefetched one, the one whose push was in
flight) and another worker trains on it: at least once, never lost. Leases belong to the
client socket that took them, so every call here is made from the training loop's thread.

The lease's length: the --batch-lease-secs flag, or by default MIN_LEASE_S or STEP_FACTOR times the
slowest step seen, whichever is longer; a held lease older than half its length is extended
before each step, so a slow stretch (a ps restart being waited out) keeps its batches.
"""

from zmqflow.common.clients.leases import Lease, rows

MIN_LEASE_S = 30.0
STEP_FACTOR = 20.0


class LeasedBatches:
    """The leases of the batch in hand and of the batch whose push is in flight."""

    def __init__(self, lease_s=None):
        self.fixed_s = lease_s
        self.slowest_step_s = 0.0
        self.in_hand = self.in_push = None
        self.acked = self.returned = 0

    def length(self):
        """Seconds to lease the next batch for."""
        return self.fixed_s or max(MIN_LEASE_S, STEP_FACTOR * self.slowest_step_s)

    def arrived(self, value):
        """The batch's values; a Lease is kept in hand until its step's push is acknowledged."""
        if not isinstance(value, Lease):
            return value
        self.in_hand = value
        return value.values

    def step_took(self, seconds):
        self.slowest_step_s = max(self.slowest_step_s, seconds)

    def pushed(self):
        """The batch in hand had its gradients sent (async): ack it when that push is settled."""
        self.in_push, self.in_hand = self.in_hand, None

    def push_settled(self):
        """The ps acknowledged the push in flight: its batch is done for good."""
        self._settle("in_push", ack=True)

    def received(self):
        """The ps acknowledged the push of the batch in hand (sync): done for good."""
        self._settle("in_hand", ack=True)

    def give_back(self):
        """The step in hand (and the push in flight) were lost: their batches go back to the queue."""
        self._settle("in_push", ack=False)
        self._settle("in_hand", ack=False)

    def keep(self):
        """Extend each held lease that has run past half its length."""
        for lease in (self.in_hand, self.in_push):
            if lease is not None:
                lease.keep(lease.seconds / 2, max(lease.seconds, self.length()))

    def _settle(self, slot, ack):
        """Settle a held lease; one that fails went back to the queue anyway (its batch is trained again)."""
        lease = getattr(self, slot)
        setattr(self, slot, None)
        if lease is None or not lease.settle(ack):
            return
        if ack:
            self.acked += rows(lease.values)
        else:
            self.returned += rows(lease.values)
