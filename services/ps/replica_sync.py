"""ReplicaSync: which replicas a shard still waits for, and when a parked sync pull is answered.

TensorFlow's SyncReplicasOptimizer makes workers wait for the next global step. Here a sync
worker pulls with `min_version` = the step it waits for; the shard parks the pull until its
version gets there. The gradient rules themselves (aggregate `replicas_to_aggregate` of the
current step, drop stale ones, spare replicas) are ShardState's (shard.py); this module holds
the rest of the protocol, apart from the sockets in server.py:

- a parked pull is answered once the version reaches its `min_version`;
- a worker that finished its input (or that the chief gave up on: `lost`) reports done; when
  fewer replicas are left than a step needs (done ones and those the shard found lost apart), the step can never complete, so every parked pull
  is answered at once marked `released` (and later ones are not parked at all);
- a lost worker that reports after all is counted done, no longer lost;
- at shutdown every parked pull is released: nobody waits on a shard that is gone.

Waiters are opaque to this module (the server's parked calls); `live(waiter)` says whether one
still wants an answer (its client may have cancelled it or passed its deadline).
"""

ANSWER, PARK, RELEASE = "answer", "park", "release"


class ReplicaSync:
    def __init__(self, state, live=lambda waiter: True):
        self.state = state                 # the shard's ShardState: version, mode and replica counts
        self.live = live
        self.done_workers, self.lost_workers = set(), set()
        self.last_push = {}                # replica -> time of its last push (the chief spots silent workers)
        self._waiters = []                 # [(waiter, min_version)] in arrival order

    # ------------------------------------------------ pulls

    def on_pull(self, min_version):
        """ANSWER now, PARK until the version reaches `min_version`, or RELEASE (the step cannot complete)."""
        if min_version is None or self.state.version >= min_version:
            return ANSWER
        return RELEASE if self.step_cannot_complete() else PARK

    def park(self, waiter, min_version):
        self._waiters.append((waiter, min_version))

    def due(self):
        """The parked pulls the current version satisfies (taken out); dead ones are dropped."""
        ready, still = [], []
        for waiter, min_version in self._waiters:
            if not self.live(waiter):
                continue
            if self.state.version >= min_version:
                ready.append(waiter)
            else:
                still.append((waiter, min_version))
        self._waiters = still
        return ready

    def release_all(self):
        """Every parked pull still wanted (taken out), to be answered `released`."""
        released = [waiter for waiter, _ in self._waiters if self.live(waiter)]
        self._waiters = []
        return released

    @property
    def parked(self):
        return len(self._waiters)

    # ------------------------------------------------ replicas

    def pushed(self, replica, now):
        self.last_push[replica] = now

    def worker_done(self, replica, lost=False):
        """Record a finished (or, `lost`, given-up) replica; returns the parked pulls to release now."""
        if not lost:
            self.lost_workers.discard(replica)
        elif replica not in self.done_workers:
            self.lost_workers.add(replica)
        self.done_workers.add(replica)
        return self.release_all() if self.step_cannot_complete() else []

    def step_cannot_complete(self):
        """Sync: fewer replicas left than a step needs: the others finished their input, were given up
        by the chief, or were found silent by this shard (its `lost`, which lowers what a step needs)."""
        total = self.state.total_num_replicas
        if self.state.mode != "sync" or total is None:
            return False
        return total - len(self.done_workers | self.state.lost) < self.state.needed()

    def idle_seconds(self, now):
        """Seconds since each replica's last push."""
        return {replica: now - at for replica, at in list(self.last_push.items())}
