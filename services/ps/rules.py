"""A ps shard's update rule: what a push does to the variables (store.py), and when a pull that
waits for a version is answered. The service (server.py) translates messages into calls here;
tests call it directly. As in TensorFlow 1.x's distributed training:

- AsyncRule: every push is applied on arrival with step = the current version, then the
  version grows by one. Options: `staleness_bound` drops pushes computed from a version
  more than that many updates old; `staleness_scaling` multiplies the gradient by
  1 / (1 + staleness); `warmup_steps` accepts only `warmup_replica`'s pushes until the
  version reaches it (one worker warms the model up before the others join).
- SyncRule (`SyncReplicasOptimizer`): pushes tagged with the current version are summed;
  when `replicas_to_aggregate` replicas have contributed, the average is applied once and
  the version grows by one. A push tagged with an older version is stale and dropped,
  so with spare replicas (total_num_replicas > replicas_to_aggregate) the late ones never
  block a step; a replica's second push for the same step is dropped as a duplicate. A
  replica the shard found silent (`lose_replica`) is lost: steps need one replica fewer until
  it is heard from again. When fewer replicas are left than a step needs (finished ones and
  lost ones apart), the step can never complete: every parked pull is released at once.
- non-finite gradients (NaN, Inf) never reach the variables: by `nonfinite` policy a push holding
  one is skipped and counted (reason 'nonfinite'; in sync it counts as its replica's contribution
  of nothing, so the step still completes) or refused with InvalidArgument naming the piece.

Sparse gradients (rows of a piece, indices local to it: an embedding table a batch
touched a few rows of) come alone (`push_sparse`, one piece) or inside a dense push
(`push(grads, ..., sparse={piece: (indices, rows)})`, one update for the whole model) and
follow the same rules; the optimizer updates only those rows (and their slot rows). In
sync mode a replica's contribution is complete once it has covered every piece (a dense
push covers all at once; empty shards count dense pushes so their version keeps step);
the step completes at `replicas_to_aggregate` complete replicas, and each piece is
updated with the average of the contributions it received (with dense pushes only,
exactly the sum over `replicas_to_aggregate`).

Both rules park a pull with `min_version` until the version gets there (how sync workers wait for
the next global step), count replicas that finished their input (or that the chief gave up on),
and release every parked pull at shutdown: nobody waits on a shard that is gone. Waiters are
opaque here (the server's parked calls); `live(waiter)` says whether one still wants an answer.
"""

import collections
import dataclasses

import numpy as np

from zmqflow.common.errors import InvalidArgumentError, check_int
from zmqflow.services.ps.store import is_int

NONFINITE_POLICIES = ("skip", "refuse")
"""What a shard does with a push holding NaN or Inf: skip it (counted), or refuse it with an error."""
ANSWER, PARK, RELEASE = "answer", "park", "release"
ASYNC_OPTIONS = {"staleness_bound": None, "staleness_scaling": False, "warmup_steps": 0, "warmup_replica": 0}
SYNC_OPTIONS = {"replicas_to_aggregate": None}


@dataclasses.dataclass
class PushResult:
    """What became of a push. Neither applied nor dropped: accumulated for the current sync
    step (applied with it later). In sync mode `applied` means this push completed the step.
    `version` is the shard's version after the push."""

    applied: bool
    dropped: bool
    reason: str | None
    staleness: int
    version: int


def update_rule(store, mode="async", **options):
    """The rule of `mode` over `store`; an option of the other mode (unless left at its default) is
    InvalidArgument naming it."""
    rules = {"async": AsyncRule, "sync": SyncRule}
    if mode not in rules:
        raise InvalidArgumentError(f"mode must be one of {', '.join(rules)}, got {mode!r}")
    other = rules["sync" if mode == "async" else "async"]
    for option, default in other.OPTIONS.items():
        if options.pop(option, default) != default:
            raise InvalidArgumentError(f"{option} applies to {other.mode} mode only")
    return rules[mode](store, **options)


class UpdateRule:
    mode, OPTIONS = None, {}   # OPTIONS: the rule's own, with their defaults

    def __init__(self, store, total_num_replicas=None, nonfinite="skip", live=lambda waiter: True):
        if nonfinite not in NONFINITE_POLICIES:
            raise InvalidArgumentError(f"nonfinite must be one of {', '.join(NONFINITE_POLICIES)}, got {nonfinite!r}")
        check_int("total_num_replicas", total_num_replicas, 1, optional=True)
        self.store, self.total_num_replicas, self.nonfinite, self.live = store, total_num_replicas, nonfinite, live
        self.done = {}          # replica -> True: it finished its input; False: the chief gave up on it
        self.last_push = {}     # replica -> time of its last push (the chief spots silent workers)
        self._waiters = []      # parked pulls: [(waiter, min_version)] in arrival order
        self._received = self._applied = self._updates = self._pending = self._bytes_pushed = 0
        self._dropped = collections.Counter()
        self._staleness = collections.Counter()

    # ------------------------------------------------ pushes

    def push(self, grads, version, replica, sparse=None):
        """Gradients of every piece, computed from parameters of `version` by `replica`: dense
        arrays in `grads`, and for the pieces named in `sparse` ({name: (indices, rows)}) only the
        rows a batch touched (an embedding table). One push is one update: one version step."""
        self.store.require_initialized()
        sparse, nbytes = self.store.check_gradients(grads, sparse or {})
        return self._receive(grads, sparse, version, replica, nbytes, self.store.specs)

    def push_sparse(self, name, indices, rows, version, replica):
        """Gradient rows `rows` ([len(indices), ...]) for rows `indices` of piece `name`."""
        self.store.require_initialized()
        name = self.store.spec_name(name)
        indices, rows = self.store.checked_rows(name, indices, rows)
        return self._receive({}, {name: (indices, rows)}, version, replica, indices.nbytes + rows.nbytes, (name,))

    def _receive(self, grads, sparse, version, replica, nbytes, pieces):
        """Check the push's tags, count it, and hand it to the rule (`pieces`: those it covers)."""
        if is_int(version, 0) and version > self.store.version:
            # computed before the shard restarted from an older checkpoint: dropped and counted, no error
            self._received += 1
            return self._drop("future", 0)
        bad = _nonfinite_piece({**grads, **{name: rows for name, (_, rows) in sparse.items()}})
        if not is_int(version, 0):
            raise InvalidArgumentError(f"push tagged with version {version!r}, but the shard is at version "
                                       f"{self.store.version}: a version must be an int the shard has reached")
        if not is_int(replica, 0) or (self.total_num_replicas is not None and replica >= self.total_num_replicas):
            raise InvalidArgumentError(f"replica must be an int in [0, {self.total_num_replicas}), got {replica!r}")
        staleness = self.store.version - version
        self._received += 1
        self._bytes_pushed += nbytes
        self._staleness[staleness] += 1
        if bad is None:
            return self._update(grads, sparse, staleness, replica, pieces)
        if self.nonfinite == "refuse":
            self._dropped["nonfinite"] += 1
            raise InvalidArgumentError(f"gradient of {bad!r} holds NaN or Inf: refused, the variables are "
                                       "unchanged (the ps runs with nonfinite=refuse)")
        return self._skip_nonfinite(staleness, replica, pieces)

    def _skip_nonfinite(self, staleness, replica, pieces):
        return self._drop("nonfinite", staleness)

    def _drop(self, reason, staleness):
        self._dropped[reason] += 1
        return PushResult(False, True, reason, staleness, self.store.version)

    def _updated(self, staleness, pushes):
        self._applied += pushes
        self._updates += 1
        return PushResult(True, False, None, staleness, self.store.version)

    # ------------------------------------------------ parked pulls

    def on_pull(self, min_version):
        """ANSWER now, PARK until the version reaches `min_version`, or RELEASE (the step cannot complete)."""
        if min_version is None or self.store.version >= min_version:
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
            if self.store.version >= min_version:
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

    def heard_from(self, replica, now):
        """A push from `replica` at `now`; True when it had been lost and steps wait for it again."""
        self.last_push[replica] = now
        return False

    def worker_done(self, replica, lost=False):
        """Record a finished (or, `lost`, given-up) replica; returns the parked pulls to release now.
        A replica given up that reports after all is counted finished."""
        if not lost or replica not in self.done:
            self.done[replica] = not lost
        return self.release_all() if self.step_cannot_complete() else []

    def given_up(self):
        """The replicas the chief counted as done without their saying so."""
        return sorted(r for r, finished in self.done.items() if not finished)

    def step_cannot_complete(self):
        return False

    def idle_seconds(self, now):
        """Seconds since each replica's last push."""
        return {replica: now - at for replica, at in list(self.last_push.items())}

    # ------------------------------------------------ reports

    def waiting_for(self):
        return {"mode": self.mode, "step": self.store.version, "contributed": [], "missing": []}

    def stats(self):
        """Counters since start. received = applied + sum(dropped) + pending."""
        return {"mode": self.mode, "version": self.store.version, "updates": self._updates,
                "pushes_received": self._received, "pushes_applied": self._applied,
                "pushes_pending": self._pending, "dropped": dict(self._dropped),
                "staleness": dict(sorted(self._staleness.items())), "pulls": self.store.pulls,
                "bytes_pushed": self._bytes_pushed, "bytes_pulled": self.store.bytes_pulled}

    def config(self):
        """The resolved settings, JSON-able (for logs)."""
        return {"mode": self.mode, "total_num_replicas": self.total_num_replicas,
                **{option: getattr(self, option) for option in self.OPTIONS}, **self.store.config()}


class AsyncRule(UpdateRule):
    mode, OPTIONS = "async", ASYNC_OPTIONS

    def __init__(self, store, staleness_bound=None, staleness_scaling=False, warmup_steps=0, warmup_replica=0,
                 **options):
        super().__init__(store, **options)
        check_int("staleness_bound", staleness_bound, optional=True)
        check_int("warmup_steps", warmup_steps)
        if not is_int(warmup_replica, 0) or (self.total_num_replicas is not None
                                             and warmup_replica >= self.total_num_replicas):
            raise InvalidArgumentError(f"warmup_replica must be a replica index, got {warmup_replica!r}")
        self.staleness_bound, self.staleness_scaling = staleness_bound, bool(staleness_scaling)
        self.warmup_steps, self.warmup_replica = warmup_steps, warmup_replica

    def _update(self, grads, sparse, staleness, replica, pieces):
        if self.store.version < self.warmup_steps and replica != self.warmup_replica:
            return self._drop("warmup", staleness)
        if self.staleness_bound is not None and staleness > self.staleness_bound:
            return self._drop("stale", staleness)
        scale = np.float64(1.0 / (1 + staleness)) if self.staleness_scaling and staleness else None
        self.store.apply(grads, sparse, scale)
        return self._updated(staleness, 1)


class SyncRule(UpdateRule):
    mode, OPTIONS = "sync", SYNC_OPTIONS

    def __init__(self, store, replicas_to_aggregate=None, total_num_replicas=None, **options):
        if not is_int(replicas_to_aggregate, 1):
            raise InvalidArgumentError(f"sync mode needs replicas_to_aggregate >= 1, got {replicas_to_aggregate!r}")
        if total_num_replicas is None:
            total_num_replicas = replicas_to_aggregate
        super().__init__(store, total_num_replicas, **options)
        if self.total_num_replicas < replicas_to_aggregate:
            raise InvalidArgumentError(
                f"total_num_replicas ({self.total_num_replicas}) must be >= replicas_to_aggregate "
                f"({replicas_to_aggregate}); the difference are spare replicas")
        self.replicas_to_aggregate = replicas_to_aggregate
        self.lost = set()      # replicas found silent past the shard's limit; steps go on without them
        # the current step
        self._contributors = {name: set() for name in store.specs}
        self._complete = set()  # replicas that covered every piece
        self._nonfinite = set()  # (piece, replica) whose push was skipped as non-finite
        store.on_load = self._clear_step

    def _update(self, grads, sparse, staleness, replica, pieces):
        if staleness:
            return self._drop("stale", staleness)
        if replica in self._complete or any(replica in self._contributors[name] for name in pieces):
            return self._drop("duplicate", staleness)
        self.store.add(grads, sparse)
        for name in (*grads, *sparse):
            self._contributors[name].add(replica)
        if all(replica in c for c in self._contributors.values()):
            self._complete.add(replica)
        return self._accumulated(staleness)

    def _skip_nonfinite(self, staleness, replica, pieces):
        """In sync a skipped push still completes its replica's share of the step (with nothing in it),
        so the step is applied from the finite contributions and never waits for this one."""
        if staleness or replica in self._complete:
            return self._drop("nonfinite", staleness)
        for name in pieces:
            self._nonfinite.add((name, replica))
        if all(replica in self._contributors[n] or (n, replica) in self._nonfinite for n in self.store.specs):
            self._complete.add(replica)
        self._dropped["nonfinite"] += 1
        result = self._accumulated(staleness)
        return result if result.applied else dataclasses.replace(result, dropped=True, reason="nonfinite")

    def _accumulated(self, staleness, counted=True):
        """A push was added to the step; apply the step when enough replicas are in."""
        self._pending += 1 if counted else 0
        if len(self._complete) < self.needed():
            return PushResult(False, False, None, staleness, self.store.version)
        self.store.apply_mean({name: len(c) for name, c in self._contributors.items()})
        applied = self._pending
        self._clear_step()
        return self._updated(staleness, applied)

    def _clear_step(self):
        for contributors in self._contributors.values():
            contributors.clear()
        self._complete.clear()
        self._nonfinite.clear()
        self._pending = 0

    # ------------------------------------------------ lost replicas and release

    def needed(self):
        """Complete replicas a step needs: replicas_to_aggregate, or fewer when replicas were lost
        (never more than are left, at least one)."""
        left = self.total_num_replicas - len(self.lost)
        return max(1, min(self.replicas_to_aggregate, left))

    def lose_replica(self, replica):
        """Go on without a replica found dead. Returns a PushResult when the step it held back
        now has enough replicas and was applied, else None."""
        self.lost.add(replica)
        if self._complete and len(self._complete) >= self.needed():
            return self._accumulated(0, counted=False)
        return None

    def heard_from(self, replica, now):
        super().heard_from(replica, now)
        if replica not in self.lost:
            return False
        self.lost.discard(replica)
        return True

    def silent(self, now, lost_after, client_seen):
        """(replica, seconds) of each replica the current step misses that was heard from but has been
        silent past `lost_after`: no push, and `client_seen(replica)` (its client's last request or
        heartbeat) as old. Never heard from (not started: a spare, a late worker), lost or done: left out."""
        for replica in self.waiting_for()["missing"]:
            if replica not in self.last_push or replica in self.lost or replica in self.done:
                continue
            silent = now - max(client_seen(replica), self.last_push[replica])
            if silent > lost_after:
                yield replica, silent

    def step_cannot_complete(self):
        """Fewer replicas left than a step needs: the others finished their input, were given up
        by the chief, or were found silent by this shard (`lost`, which lowers what a step needs)."""
        return self.total_num_replicas - len(self.done.keys() | self.lost) < self.needed()

    def waiting_for(self):
        """The step being aggregated, who has contributed and who has not (for stall reports);
        `partial` lists replicas that covered only some pieces."""
        partial = set().union(*self._contributors.values()) - self._complete
        return {"mode": "sync", "step": self.store.version, "needed": self.needed(), "lost": sorted(self.lost),
                "contributed": sorted(self._complete), "partial": sorted(partial),
                "missing": [r for r in range(self.total_num_replicas) if r not in self._complete]}


def _nonfinite_piece(arrays):
    """The name of the first float array holding a NaN or an Inf, else None. `isfinite().all()` took
    17 us for the MNIST MLP's gradients, a sum (which would also flag an overflow) 43 us."""
    for name, array in arrays.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return name
    return None
