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
- ElasticSyncRule (`elastic`, Horovod's elastic mode): sync whose replicas join (`join`, from the next step
  boundary) and leave (done, or lost); a step aggregates exactly the replicas that were members when it began,
  while `min_replicas` are; `max_replicas` bounds the replica indices.
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

from zmqflow.common.errors import FailedPreconditionError, InvalidArgumentError, check_int
from zmqflow.services.ps.store import is_int

NONFINITE_POLICIES = ("skip", "refuse")
"""What a shard does with a push holding NaN or Inf: skip it (counted), or refuse it with an error."""
ANSWER, PARK, RELEASE = "answer", "park", "release"
ASYNC_OPTIONS = {"staleness_bound": None, "staleness_scaling": False, "warmup_steps": 0, "warmup_replica": 0}
SYNC_OPTIONS = {"replicas_to_aggregate": None}
ELASTIC_OPTIONS = {"min_replicas": 1, "max_replicas": None}
"""Elastic sync's own options (Horovod's min_np and max_np): replicas_to_aggregate follows the members."""


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


def update_rule(store, mode="async", elastic=False, **options):
    """The rule of `mode` over `store` (`elastic`: sync whose members come and go); an option of another
    rule (unless left at its default) is InvalidArgument naming it."""
    rules = {"async": AsyncRule, "sync": SyncRule}
    if mode not in rules:
        raise InvalidArgumentError(f"mode must be one of {', '.join(rules)}, got {mode!r}")
    if elastic and mode != "sync":
        raise InvalidArgumentError("elastic applies to sync mode only (async workers come and go freely)")
    rule = ElasticSyncRule if elastic else rules[mode]
    for other in {AsyncRule, SyncRule, ElasticSyncRule} - {rule}:
        for option, default in other.OPTIONS.items():
            if option not in rule.OPTIONS and options.pop(option, default) != default:
                raise InvalidArgumentError(f"{option} applies to {other.describe}, not to {rule.describe}")
    return rule(store, **options)


class UpdateRule:
    mode, OPTIONS = None, {}   # OPTIONS: the rule's own, with their defaults
    describe = None            # the rule in an error message
    elastic = False            # sync whose replicas join and leave (ElasticSyncRule)

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

    def join(self, replica, step=None):
        """The step from which `replica`'s pushes count: here at once (elastic sync overrides it)."""
        self.store.require_initialized()
        return self.store.version

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
    mode, OPTIONS, describe = "async", ASYNC_OPTIONS, "async mode"

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
    mode, OPTIONS, describe = "sync", SYNC_OPTIONS, "sync mode"

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
        if not self._step_complete():
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
        if self._complete and self._step_complete():
            return self._accumulated(0, counted=False)
        return None

    def _step_complete(self):
        return len(self._complete) >= self.needed()

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


class ElasticSyncRule(SyncRule):
    """Sync whose replicas come and go, as Horovod's elastic mode (and Ray Train's (min, max) workers): a step
    aggregates exactly the replicas that were members when it began. A replica joins (`join`) at the next step
    boundary, or into the current step when that step cannot complete without it (fewer members than
    `min_replicas`): its gradients then come from the step's own parameters, never from an older step. It leaves
    by `worker_done` or by being found silent (`lose_replica`): the step in progress then needs one replica fewer
    (a contribution it already made stays in). A push from a replica that is no member of the step is dropped
    ('not_member'): a lost replica heard from again joins anew. Steps wait while fewer than `min_replicas` are
    members; `max_replicas` bounds the replica indices."""

    OPTIONS, describe = ELASTIC_OPTIONS, "elastic sync mode (each step aggregates every member)"
    elastic = True
    HISTORY = 1000   # membership changes kept for stats

    def __init__(self, store, min_replicas=1, max_replicas=None, total_num_replicas=None, **options):
        check_int("min_replicas", min_replicas, 1)
        check_int("max_replicas", max_replicas, 1, optional=True)
        if total_num_replicas is not None:
            raise InvalidArgumentError("elastic sync takes max_replicas, not total_num_replicas: members come and go")
        if max_replicas is not None and max_replicas < min_replicas:
            raise InvalidArgumentError(f"max_replicas ({max_replicas}) must be >= min_replicas ({min_replicas})")
        super().__init__(store, replicas_to_aggregate=1, total_num_replicas=max_replicas, **options)
        self.total_num_replicas = max_replicas   # the bound of replica indices (None: none)
        self.min_replicas, self.max_replicas = min_replicas, max_replicas
        self.members = set()   # the replicas the current step aggregates
        self.pending = {}      # replica -> the step from which it is a member
        self.history = collections.deque(maxlen=self.HISTORY)  # {step, replicas, joined, left} per change
        self.aggregated = collections.Counter()  # replicas aggregated -> steps applied with that many

    def needed(self):
        return max(self.min_replicas, len(self.members))

    def _step_complete(self):
        return len(self.members) >= self.min_replicas and self.members <= self._complete

    def _update(self, grads, sparse, staleness, replica, pieces):
        if not staleness and replica not in self.members:
            return self._drop("not_member", staleness)
        return super()._update(grads, sparse, staleness, replica, pieces)

    def _skip_nonfinite(self, staleness, replica, pieces):
        if not staleness and replica not in self.members:
            return self._drop("not_member", staleness)
        return super()._skip_nonfinite(staleness, replica, pieces)

    def _accumulated(self, staleness, counted=True):
        complete = len(self._complete)
        result = super()._accumulated(staleness, counted)
        if result.applied:
            self.aggregated[complete] += 1
            due = sorted(r for r, step in self.pending.items() if step <= self.store.version)
            for replica in due:
                del self.pending[replica]
            self._change(joined=due)
        return result

    def join(self, replica, step=None):
        """Admit `replica` from step `step` (None: the next step boundary, or the current step when it cannot
        complete without a new member); returns that step. A step already begun here is too late only when
        it is over: FailedPrecondition, and the caller asks again for a later one."""
        self.store.require_initialized()
        if not is_int(replica, 0) or (self.max_replicas is not None and replica >= self.max_replicas):
            bound = "" if self.max_replicas is None else f" in [0, {self.max_replicas}) (max_replicas)"
            raise InvalidArgumentError(f"replica {replica!r} cannot join this elastic sync job: a replica is an "
                                       f"int{bound}")
        version = self.store.version
        if step is not None:
            check_int("step", step)
            if step < version:
                raise FailedPreconditionError(f"replica {replica} cannot join at step {step}: this shard is at "
                                              f"step {version} already")
        self.done.pop(replica, None)
        self.lost.discard(replica)
        if replica in self.members:        # a restarted replica rejoining before it was found lost
            return version + 1 if replica in self._complete else version
        if step is None:
            step = version if len(self.members) < self.min_replicas else version + 1
        if step == version:
            self.pending.pop(replica, None)
            self._change(joined=[replica])
        else:
            self.pending[replica] = step
        return step

    def _leave(self, replica):
        """`replica` is no member any more; the step in progress may now be complete."""
        was = self.pending.pop(replica, None) is not None
        if replica in self.members:
            self._change(left=[replica])
            if self._complete and self._step_complete():
                self._accumulated(0, counted=False)
            return True
        return was

    def worker_done(self, replica, lost=False):
        released = super().worker_done(replica, lost)
        self._leave(replica)
        return released

    def lose_replica(self, replica):
        self.lost.add(replica)
        applied = self.store.version
        self._leave(replica)
        return True if self.store.version > applied else None

    def heard_from(self, replica, now):
        """A lost replica heard from again is no member: it joins anew (its pushes say 'not_member')."""
        self.last_push[replica] = now
        return False

    def step_cannot_complete(self):
        """Never: while fewer than min_replicas are members, steps wait for one to join (Horovod waits for
        min_np); the members left are alive (the silent ones were lost, the finished ones left)."""
        return False

    def _change(self, joined=(), left=()):
        self.members.update(joined)
        self.members.difference_update(left)
        if joined or left:
            self.history.append({"step": self.store.version, "replicas": len(self.members),
                                 "joined": sorted(joined), "left": sorted(left)})

    def waiting_for(self):
        partial = set().union(*self._contributors.values()) - self._complete
        return {"mode": "sync", "elastic": True, "step": self.store.version, "needed": self.needed(),
                "lost": sorted(self.lost), "contributed": sorted(self._complete), "partial": sorted(partial),
                "missing": sorted(self.members - self._complete)}

    def config(self):
        return {**super().config(), "elastic": True}

    def stats(self):
        """Besides the counters: the members of the current step, the replicas admitted from a later step
        (`pending`: replica -> step), the membership changes and how many replicas each applied step had."""
        return {**super().stats(), "elastic": True, "replicas_to_aggregate": self.needed(),
                "members": sorted(self.members), "pending": {str(r): s for r, s in sorted(self.pending.items())},
                "membership": list(self.history),
                "steps_by_replicas": {str(n): k for n, k in sorted(self.aggregated.items())}}


def _nonfinite_piece(arrays):
    """The name of the first float array holding a NaN or an Inf, else None. `isfinite().all()` took
    17 us for the MNIST MLP's gradients, a sum (which would also flag an overflow) 43 us."""
    for name, array in arrays.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return name
    return None
