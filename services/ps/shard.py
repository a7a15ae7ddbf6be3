"""The state of one ps shard: its pieces of the variables, their optimizer slots, the version
(global step as this shard sees it) and the update rule. Plain numpy, no sockets: the
server translates messages into calls here, and tests call it directly. Not thread-safe
(the service loop is single-threaded).

Update rules, as in TensorFlow 1.x's distributed training:

- async: every push is applied on arrival with step = the current version, then the
  version grows by one. Options: `staleness_bound` drops pushes computed from a version
  more than that many updates old; `staleness_scaling` multiplies the gradient by
  1 / (1 + staleness); `warmup_steps` accepts only `warmup_replica`'s pushes until the
  version reaches it (one worker warms the model up before the others join).
- sync (`SyncReplicasOptimizer`): pushes tagged with the current version are summed;
  when `replicas_to_aggregate` replicas have contributed, the average is applied once and
  the version grows by one. A push tagged with an older version is stale and dropped,
  so with spare replicas (total_num_replicas > replicas_to_aggregate) the late ones never
  block a step; a replica's second push for the same step is dropped as a duplicate.
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

Pulls return read-only snapshots: one fresh contiguous buffer with a view per piece, so
the server can send it zero-copy while later pushes update the live values. Full pulls of
an unchanged state share one snapshot (sync workers all pull the same step).
"""

import collections
import dataclasses
import sys
from collections.abc import Mapping

import numpy as np

from zmqflow.common.dtypes import as_numpy
from zmqflow.common.errors import (AlreadyExistsError, FailedPreconditionError, InvalidArgumentError,
                           NotFoundError)
from zmqflow.services.ps.optimizers import Optimizer, make_optimizer

MODES = ("async", "sync")
_ALIGN = 64  # bytes between pieces in a snapshot buffer, so every view is aligned
DIRECT_APPLY_BYTES = 4 * 1024 * 1024  # above this, async pushes skip the copy into the flat layout
NONFINITE_POLICIES = ("skip", "refuse")
"""What a shard does with a push holding NaN or Inf: skip it (counted), or refuse it with an error."""


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


class ShardState:
    def __init__(self, pieces, optimizer, mode="async", replicas_to_aggregate=None, total_num_replicas=None,
                 staleness_bound=None, staleness_scaling=False, warmup_steps=0, warmup_replica=0,
                 nonfinite="skip"):
        self.specs = _check_pieces(pieces)
        if nonfinite not in NONFINITE_POLICIES:
            raise InvalidArgumentError(f"nonfinite must be one of {', '.join(NONFINITE_POLICIES)}, got {nonfinite!r}")
        self.nonfinite = nonfinite
        self.optimizer = optimizer if isinstance(optimizer, Optimizer) else make_optimizer(optimizer)
        self.mode = mode
        self.replicas_to_aggregate, self.total_num_replicas = replicas_to_aggregate, total_num_replicas
        self.staleness_bound, self.staleness_scaling = staleness_bound, bool(staleness_scaling)
        self.warmup_steps, self.warmup_replica = warmup_steps, warmup_replica
        self._check_options()

        self._offsets, nbytes = _layout(self.specs)
        self._buffer = np.zeros(nbytes, np.uint8)  # all values, contiguous: a full pull is one memcpy
        self._values = _views(self._buffer, self.specs, self._offsets)
        # Slots and gradient scratch share the values' layout. With one dtype for every piece, a
        # dense update is then ONE optimizer call over the flat buffers (padding has zero
        # gradients and stays zero) instead of a kernel dispatch per piece: 4 calls of the
        # MNIST MLP's Adam took 533 us per push on the ps, one call takes about half.
        dtypes = {dtype for _, dtype in self.specs.values()}
        self._flat_dtype = dtypes.pop() if len(dtypes) == 1 else None
        slot_buffers = {spec.name: np.full(nbytes // self._itemsize(), spec.initial_value, self._flat_dtype)
                        for spec in self.optimizer.slot_specs((1,))} if self._flat_dtype else {}
        if self._flat_dtype:
            self._flat_slots = {n: b for n, b in slot_buffers.items()}
            self._slots = {name: {n: _views(b.view(np.uint8), {name: self.specs[name]}, self._offsets)[name]
                                  for n, b in slot_buffers.items()} for name in self.specs}
        else:
            self._slots = {name: self.optimizer.create_slots(v) for name, v in self._values.items()}
        self._grad_buffer = np.zeros(nbytes, np.uint8)  # dense gradients (sync: their sum) in the layout
        self._scratch = _views(self._grad_buffer, self.specs, self._offsets)
        self._snapshots = SnapshotPool(nbytes)
        self._warm_up()

        # the current sync step
        self._dense_count = dict.fromkeys(self.specs, 0)  # dense gradients summed in _scratch
        self._sparse = {name: [] for name in self.specs}  # (indices, rows) copies
        self._contributors = {name: set() for name in self.specs}
        self._complete = set()  # replicas that covered every piece
        self._contributors_nonfinite = set()  # (piece, replica) whose push was skipped as non-finite
        self.lost = set()  # sync: replicas the ps found silent past its limit; steps go on without them
        self._pending = 0  # pushes accumulated, not yet applied

        self.initialized = False
        self.version = 0
        self._generation = 0  # bumped on every change of the values: keys the shared snapshot
        self._snapshot = None
        self._received = self._applied = self._updates = self._pulls = 0
        self._bytes_pushed = self._bytes_pulled = 0
        self._dropped = collections.Counter()
        self._staleness = collections.Counter()

    def _warm_up(self):
        """Compile (or load from numba's cache) the update kernel now, not during the first push:
        it took 0.38 s there, inside the training time."""
        for dtype in {dtype for _, dtype in self.specs.values()}:
            var = np.zeros(1, dtype)
            self.optimizer.apply_dense(var, np.zeros(1, dtype), self.optimizer.create_slots(var), 0)

    def _fresh_snapshot(self):
        """Read-only views into a copy of the values (a pooled buffer when one is free)."""
        buffer = self._snapshots.take()
        np.copyto(buffer, self._buffer)
        return {name: _read_only(view) for name, view in _views(buffer, self.specs, self._offsets).items()}

    def _itemsize(self):
        return self._flat_dtype.itemsize if self._flat_dtype else 1

    def _apply_flat(self):
        """One dense update of every piece with the gradients in the scratch layout.
        Falls back to one call per piece for mixed dtypes."""
        if self._flat_dtype is None:
            for name, var in self._values.items():
                self.optimizer.apply_dense(var, self._scratch[name], self._slots[name], self.version)
            return
        flat = self._flat_dtype
        self.optimizer.apply_dense(self._buffer.view(flat), self._grad_buffer.view(flat), self._flat_slots,
                                   self.version)

    # ------------------------------------------------------------------ set-up

    def _check_options(self):
        if self.mode not in MODES:
            raise InvalidArgumentError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.total_num_replicas is not None and not _is_int(self.total_num_replicas, 1):
            raise InvalidArgumentError(f"total_num_replicas must be an integer >= 1, got {self.total_num_replicas!r}")
        if self.mode == "sync":
            for option, default in (("staleness_bound", None), ("staleness_scaling", False), ("warmup_steps", 0)):
                if getattr(self, option) != default:
                    raise InvalidArgumentError(f"{option} applies to async mode only")
            if not _is_int(self.replicas_to_aggregate, 1):
                raise InvalidArgumentError(
                    f"sync mode needs replicas_to_aggregate >= 1, got {self.replicas_to_aggregate!r}")
            if self.total_num_replicas is None:
                self.total_num_replicas = self.replicas_to_aggregate
            if self.total_num_replicas < self.replicas_to_aggregate:
                raise InvalidArgumentError(
                    f"total_num_replicas ({self.total_num_replicas}) must be >= replicas_to_aggregate "
                    f"({self.replicas_to_aggregate}); the difference are spare replicas")
            return
        if self.replicas_to_aggregate is not None:
            raise InvalidArgumentError("replicas_to_aggregate applies to sync mode only")
        if self.staleness_bound is not None and not _is_int(self.staleness_bound, 0):
            raise InvalidArgumentError(f"staleness_bound must be an integer >= 0, got {self.staleness_bound!r}")
        if not _is_int(self.warmup_steps, 0):
            raise InvalidArgumentError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not _is_int(self.warmup_replica, 0) or (self.total_num_replicas is not None
                                                   and self.warmup_replica >= self.total_num_replicas):
            raise InvalidArgumentError(f"warmup_replica must be a replica index, got {self.warmup_replica!r}")

    def initialize(self, values, step=0, force=False):
        """The chief's initial values. Once only: a repeated identical call (a retried request)
        is a no-op, a different one is AlreadyExists unless `force`."""
        _check_arrays(values, self.specs, "initial values")
        _check_step(step)
        if self.initialized and not force:
            if step == self.version and all(np.array_equal(values[n], v) for n, v in self._values.items()):
                return
            raise AlreadyExistsError(f"variables of ps shard already initialized (version {self.version}); "
                                     "initialize with force=True to overwrite them")
        self._load(values, None, step)

    def restore(self, values, slots, step):
        """Values and optimizer slots from a checkpoint (`slots` None: fresh slots)."""
        _check_arrays(values, self.specs, "restored values")
        _check_step(step)
        if slots is not None:
            if not isinstance(slots, Mapping) or set(slots) != set(self.specs):
                raise InvalidArgumentError("restored slots must name exactly the shard's pieces")
            for name, (shape, dtype) in self.specs.items():
                expected = {s.name: (s.shape, dtype) for s in self.optimizer.slot_specs(shape)}
                _check_arrays(slots[name], expected, f"slots of {name!r} (optimizer {self.optimizer.kind})")
        self._load(values, slots, step)

    def advance_to(self, version):
        """Raise the version to `version` (never lower it): a shard restored from an older checkpoint
        rejoins in step with the shards that kept theirs, and no parked pull waits for a step again."""
        if version > self.version:
            self.version = int(version)
            self._generation += 1

    def _load(self, values, slots, step):
        for name, var in self._values.items():
            np.copyto(var, values[name])
            for spec in self.optimizer.slot_specs(var.shape):
                slot = self._slots[name][spec.name]
                if slots is None:
                    slot.fill(spec.initial_value)
                else:
                    np.copyto(slot, slots[name][spec.name])
        self._clear_step()
        self.version, self.initialized = int(step), True
        self._generation += 1

    # ------------------------------------------------------------------ pull

    def pull(self, names=None, newer_than=None):
        """(version, {name: read-only array}) of a snapshot; (version, None) when `newer_than`
        is given and the shard has nothing newer."""
        self._require_initialized()
        if newer_than is not None and self.version <= newer_than:
            return self.version, None
        if names is None:
            if self._snapshot is None or self._snapshot[0] != self._generation:
                self._snapshot = (self._generation, self._fresh_snapshot())
            values = dict(self._snapshot[1])
        else:
            specs = {name: self._spec(name) for name in names}
            offsets, nbytes = _layout(specs)
            values = _views(np.empty(nbytes, np.uint8), specs, offsets)
            for name, view in values.items():
                np.copyto(view, self._values[name])
                view.flags.writeable = False
        self._pulls += 1
        self._bytes_pulled += sum(v.nbytes for v in values.values())
        return self.version, values

    def pull_rows(self, name, indices):
        """A fresh copy of rows `indices` (local to the piece) of piece `name`."""
        self._require_initialized()
        var = self._values[self._spec_name(name)]
        indices = _check_indices(indices, var.shape, name)
        rows = var[indices]
        self._pulls += 1
        self._bytes_pulled += rows.nbytes
        return rows

    # ------------------------------------------------------------------ assign

    def assign(self, values):
        """New values of some pieces, set as they are: the non-trainable variables a model
        computes (BatchNorm's moving statistics), never given to the optimizer. The version
        does not move; the last writer wins, as TensorFlow's assign on a ps variable."""
        self._require_initialized()
        unknown = sorted(set(values) - set(self.specs))
        if unknown:
            raise InvalidArgumentError(f"assign names pieces this shard does not hold: {unknown}")
        _check_arrays(values, {n: self.specs[n] for n in values}, "assigned values")
        for name, value in values.items():
            np.copyto(self._values[name], value)
        self._generation += 1          # pulls see the new values
        return len(values)

    # ------------------------------------------------------------------ push

    def push(self, grads, version, replica, sparse=None):
        """Gradients of every piece, computed from parameters of `version` by `replica`: dense
        arrays in `grads`, and for the pieces named in `sparse` ({name: (indices, rows)}) only the
        rows a batch touched (an embedding table). One push is one update: one version step."""
        self._require_initialized()
        sparse = self._check_sparse(sparse or {})
        nbytes = _check_arrays(grads, {n: s for n, s in self.specs.items() if n not in sparse}, "gradients")
        nbytes += sum(i.nbytes + r.nbytes for i, r in sparse.values())
        if self._from_the_future(version):
            return self._drop("future", 0)
        bad = _nonfinite_piece({**grads, **{name: rows for name, (_, rows) in sparse.items()}})
        staleness = self._receive(version, replica, nbytes)
        if bad is not None:
            return self._nonfinite_push(bad, staleness, replica)
        if self.mode == "async":
            reason = self._async_drop_reason(staleness, replica)
            if reason:
                return self._drop(reason, staleness)
            scale = self._scale(staleness)
            if sparse or (scale is None and (len(grads) == 1 or self._buffer.nbytes > DIRECT_APPLY_BYTES)):
                # big pieces: apply straight from the received frames; a copy would cost more
                # than the kernel dispatches it saves. Sparse pieces: only their rows move.
                for name, grad in grads.items():
                    if scale is not None:
                        grad = grad * scale.astype(grad.dtype)
                    self.optimizer.apply_dense(self._values[name], grad, self._slots[name], self.version)
                for name, (indices, rows) in sparse.items():
                    if scale is not None:
                        rows = rows * scale.astype(rows.dtype)
                    self.optimizer.apply_sparse(self._values[name], indices, rows, self._slots[name], self.version)
                return self._updated(staleness, 1)
            for name, grad in grads.items():
                np.copyto(self._scratch[name], grad)
                if scale is not None:
                    view = self._scratch[name]
                    np.multiply(view, scale.astype(view.dtype), out=view)
            self._apply_flat()
            return self._updated(staleness, 1)
        if staleness:
            return self._drop("stale", staleness)
        if replica in self._complete or any(replica in c for c in self._contributors.values()):
            return self._drop("duplicate", staleness)
        for name, grad in grads.items():
            acc = self._scratch[name]
            if self._dense_count[name]:
                np.add(acc, grad, out=acc)
            else:
                np.copyto(acc, grad)
            self._dense_count[name] += 1
            self._contributors[name].add(replica)
        for name, (indices, rows) in sparse.items():
            self._sparse[name].append((indices.copy(), rows.copy()))
            self._contributors[name].add(replica)
        self._complete.add(replica)
        return self._accumulated(staleness)

    def _check_sparse(self, sparse):
        """{name: (indices as a flat int array, rows)} after checking names, bounds, shapes and dtypes."""
        if not isinstance(sparse, Mapping):
            raise InvalidArgumentError(f"sparse gradients must map piece names to (indices, rows), got "
                                       f"{type(sparse).__name__}")
        checked = {}
        for name, pair in sparse.items():
            name = self._spec_name(name)
            try:
                indices, rows = pair
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"sparse gradient of {name!r} must be (indices, rows)") from None
            checked[name] = self._checked_rows(name, indices, rows)
        return checked

    def _checked_rows(self, name, indices, rows):
        var = self._values[name]
        indices = _check_indices(indices, var.shape, name).reshape(-1)
        if not isinstance(rows, np.ndarray) or rows.dtype != var.dtype or rows.shape != indices.shape + var.shape[1:]:
            raise InvalidArgumentError(
                f"sparse gradient of {name!r} must be {var.dtype} rows of shape "
                f"{list(indices.shape + var.shape[1:])}, got {getattr(rows, 'dtype', type(rows).__name__)} "
                f"{list(np.shape(rows))}")
        return indices, rows

    def push_sparse(self, name, indices, rows, version, replica):
        """Gradient rows `rows` ([len(indices), ...]) for rows `indices` of piece `name`."""
        self._require_initialized()
        name = self._spec_name(name)
        var = self._values[name]
        indices, rows = self._checked_rows(name, indices, rows)
        if self._from_the_future(version):
            return self._drop("future", 0)
        staleness = self._receive(version, replica, indices.nbytes + rows.nbytes)
        if _nonfinite_piece({name: rows}) is not None:
            return self._nonfinite_push(name, staleness, replica, pieces=(name,))
        if self.mode == "async":
            reason = self._async_drop_reason(staleness, replica)
            if reason:
                return self._drop(reason, staleness)
            scale = self._scale(staleness)
            if scale is not None:
                rows = rows * scale.astype(var.dtype)
            self.optimizer.apply_sparse(var, indices, rows, self._slots[name], self.version)
            return self._updated(staleness, 1)
        if staleness:
            return self._drop("stale", staleness)
        if replica in self._complete or replica in self._contributors[name]:
            return self._drop("duplicate", staleness)
        self._sparse[name].append((indices.copy(), rows.copy()))
        self._contributors[name].add(replica)
        if all(replica in c for c in self._contributors.values()):
            self._complete.add(replica)
        return self._accumulated(staleness)

    def _from_the_future(self, version):
        """A push tagged with a version this shard never reached: it was computed before the shard
        restarted from an older checkpoint. It is dropped and counted (reason 'future'), not an error."""
        if _is_int(version, 0) and version > self.version:
            self._received += 1
            return True
        return False

    def _receive(self, version, replica, nbytes):
        """Check the push's tags, count it, and return its staleness."""
        if not _is_int(version, 0) or version > self.version:
            raise InvalidArgumentError(f"push tagged with version {version!r}, but the shard is at version "
                                       f"{self.version}: a version must be an int the shard has reached")
        if not _is_int(replica, 0) or (self.total_num_replicas is not None and replica >= self.total_num_replicas):
            raise InvalidArgumentError(f"replica must be an int in [0, {self.total_num_replicas}), got {replica!r}")
        staleness = self.version - version
        self._received += 1
        self._bytes_pushed += nbytes
        self._staleness[staleness] += 1
        return staleness

    def _async_drop_reason(self, staleness, replica):
        if self.version < self.warmup_steps and replica != self.warmup_replica:
            return "warmup"
        if self.staleness_bound is not None and staleness > self.staleness_bound:
            return "stale"
        return None

    def _scale(self, staleness):
        return np.float64(1.0 / (1 + staleness)) if self.staleness_scaling and staleness else None

    def _nonfinite_push(self, piece, staleness, replica, pieces=None):
        """A push with a NaN or Inf in `piece`: refused (policy 'refuse'), or skipped and counted. In
        sync a skipped push still completes its replica's share of the step (with nothing in it), so
        the step is applied from the finite contributions and never waits for this one."""
        if self.nonfinite == "refuse":
            self._dropped["nonfinite"] += 1
            raise InvalidArgumentError(f"gradient of {piece!r} holds NaN or Inf: refused, the variables are "
                                       "unchanged (the ps runs with nonfinite=refuse)")
        if self.mode == "sync" and not staleness and replica not in self._complete:
            for name in pieces or self.specs:
                self._contributors_nonfinite.add((name, replica))
            if all(replica in self._contributors[n] or (n, replica) in self._contributors_nonfinite
                   for n in self.specs):
                self._complete.add(replica)
            self._dropped["nonfinite"] += 1
            result = self._accumulated(staleness)
            return result if result.applied else dataclasses.replace(result, dropped=True, reason="nonfinite")
        return self._drop("nonfinite", staleness)

    def _drop(self, reason, staleness):
        self._dropped[reason] += 1
        return PushResult(False, True, reason, staleness, self.version)

    def needed(self):
        """Sync: complete replicas a step needs: replicas_to_aggregate, or fewer when replicas were lost
        (never more than are left, at least one)."""
        left = self.total_num_replicas - len(self.lost)
        return max(1, min(self.replicas_to_aggregate, left))

    def lose_replica(self, replica):
        """Sync: go on without a replica found dead. Returns a PushResult when the step it held back
        now has enough replicas and was applied, else None."""
        self.lost.add(replica)
        if self._complete and len(self._complete) >= self.needed():
            return self._accumulated(0, counted=False)
        return None

    def regain_replica(self, replica):
        """A lost replica is heard from again: steps wait for it once more."""
        self.lost.discard(replica)

    def _accumulated(self, staleness, counted=True):
        """A sync push was added to the step; apply the step when enough replicas are in."""
        self._pending += 1 if counted else 0
        if len(self._complete) < self.needed():
            return PushResult(False, False, None, staleness, self.version)
        counts = {len(c) for c in self._contributors.values()}
        if self._flat_dtype is not None and not any(self._sparse.values()) and len(counts) == 1 and 0 not in counts:
            flat = self._grad_buffer.view(self._flat_dtype)  # dense only: average and apply in one call
            np.divide(flat, self._flat_dtype.type(counts.pop()), out=flat)
            self._apply_flat()
        else:
            for name, var in self._values.items():
                self._apply_average(name, var)
        applied = self._pending
        self._clear_step()
        return self._updated(staleness, applied)

    def _apply_average(self, name, var):
        """Apply the mean of the step's contributions to piece `name` (dense sum + sparse rows)."""
        count = len(self._contributors[name])
        if not count:
            return
        acc, sparse = self._scratch[name], self._sparse[name]
        if self._dense_count[name]:
            for indices, rows in sparse:
                np.add.at(acc, indices, rows)
            np.divide(acc, var.dtype.type(count), out=acc)
            self.optimizer.apply_dense(var, acc, self._slots[name], self.version)
        else:
            indices = np.concatenate([i for i, _ in sparse])
            rows = np.concatenate([r for _, r in sparse])
            np.divide(rows, var.dtype.type(count), out=rows)
            self.optimizer.apply_sparse(var, indices, rows, self._slots[name], self.version)

    def _updated(self, staleness, pushes):
        self.version += 1
        self._generation += 1
        self._applied += pushes
        self._updates += 1
        return PushResult(True, False, None, staleness, self.version)

    def _clear_step(self):
        for name in self.specs:
            self._dense_count[name] = 0
            self._sparse[name].clear()
            self._contributors[name].clear()
        self._complete.clear()
        self._contributors_nonfinite.clear()
        self._pending = 0

    # ------------------------------------------------------------------ reports and checkpoints

    def waiting_for(self):
        """Sync: the step being aggregated, who has contributed and who has not (for stall
        reports); `partial` lists replicas that covered only some pieces."""
        if self.mode == "async":
            return {"mode": "async", "step": self.version, "contributed": [], "missing": []}
        partial = set().union(*self._contributors.values()) - self._complete
        return {"mode": "sync", "step": self.version, "needed": self.needed(), "lost": sorted(self.lost),
                "contributed": sorted(self._complete), "partial": sorted(partial),
                "missing": [r for r in range(self.total_num_replicas) if r not in self._complete]}

    def stats(self):
        """Counters since start. received = applied + sum(dropped) + pending."""
        return {"mode": self.mode, "version": self.version, "updates": self._updates,
                "pushes_received": self._received, "pushes_applied": self._applied,
                "pushes_pending": self._pending, "dropped": dict(self._dropped),
                "staleness": dict(sorted(self._staleness.items())), "pulls": self._pulls,
                "bytes_pushed": self._bytes_pushed, "bytes_pulled": self._bytes_pulled}

    def snapshot_for_checkpoint(self):
        """(step, {name: value}, {name: {slot: value}}), all copies."""
        self._require_initialized()
        values = {name: v.copy() for name, v in self._values.items()}
        slots = {name: {s: a.copy() for s, a in slots.items()} for name, slots in self._slots.items()}
        return self.version, values, slots

    @property
    def optimizer_config(self):
        return self.optimizer.get_config()

    def config(self):
        """The resolved settings, JSON-able (for logs and checkpoint manifests)."""
        return {"mode": self.mode, "replicas_to_aggregate": self.replicas_to_aggregate,
                "total_num_replicas": self.total_num_replicas, "staleness_bound": self.staleness_bound,
                "staleness_scaling": self.staleness_scaling, "warmup_steps": self.warmup_steps,
                "warmup_replica": self.warmup_replica, "optimizer": self.optimizer_config,
                "pieces": {n: {"shape": list(s), "dtype": d.name} for n, (s, d) in self.specs.items()}}

    # ------------------------------------------------------------------ helpers

    def _require_initialized(self):
        if not self.initialized:
            raise FailedPreconditionError("variables of ps shard not initialized; the chief initializes them")

    def _spec_name(self, name):
        if name not in self.specs:
            raise NotFoundError(f"ps shard has no variable {name!r}; it holds {', '.join(self.specs) or 'none'}")
        return name

    def _spec(self, name):
        return self.specs[self._spec_name(name)]


def _check_pieces(pieces):
    """{name: (shape tuple, numpy float dtype)} from {name: (shape, dtype name)}."""
    if not isinstance(pieces, Mapping):
        raise InvalidArgumentError(f"pieces must be a mapping of name -> (shape, dtype), got {type(pieces).__name__}")
    specs = {}
    for name, spec in pieces.items():
        try:
            shape, dtype = spec
            shape, dtype = tuple(int(d) for d in shape), as_numpy(dtype) if isinstance(dtype, str) else np.dtype(dtype)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"piece {name!r}: expected (shape, dtype), got {spec!r}") from exc
        if not isinstance(name, str) or not name or dtype.kind != "f" or any(d < 0 for d in shape):
            raise InvalidArgumentError(f"piece {name!r}: needs a name, a shape of sizes >= 0 and a float dtype, "
                                       f"got {list(shape)} {dtype}")
        specs[name] = (shape, dtype)
    return specs


def _nonfinite_piece(arrays):
    """The name of the first float array holding a NaN or an Inf, else None. `isfinite().all()` took
    17 us for the MNIST MLP's gradients, a sum (which would also flag an overflow) 43 us."""
    for name, array in arrays.items():
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            return name
    return None


def _check_arrays(arrays, specs, what):
    """InvalidArgument listing every missing, unknown or mis-shaped array; else the total bytes."""
    if not isinstance(arrays, Mapping):
        raise InvalidArgumentError(f"{what} must be a mapping of name -> array, got {type(arrays).__name__}")
    problems = [f"{n!r} is missing" for n in specs if n not in arrays]
    problems += [f"{n!r} is not held by this shard" for n in arrays if n not in specs]
    nbytes = 0
    for name, array in arrays.items():
        if name not in specs:
            continue
        shape, dtype = specs[name]
        if not isinstance(array, np.ndarray) or array.shape != shape or array.dtype != dtype:
            problems.append(f"{name!r} is {getattr(array, 'dtype', type(array).__name__)} "
                            f"{list(np.shape(array))}, expected {dtype} {list(shape)}")
        else:
            nbytes += array.nbytes
    if problems:
        raise InvalidArgumentError(f"{what} do not match the shard's variables: {'; '.join(problems)}")
    return nbytes


def _check_indices(indices, shape, name):
    if not isinstance(indices, np.ndarray) or indices.dtype.kind not in "iu" or not shape:
        raise InvalidArgumentError(f"row indices of {name!r} must be an integer array (and the piece a matrix)")
    if indices.size and (indices.min() < 0 or indices.max() >= shape[0]):
        raise InvalidArgumentError(f"row indices of {name!r} must be in [0, {shape[0]})")
    return indices


def _check_step(step):
    if not _is_int(step, 0):
        raise InvalidArgumentError(f"step must be an integer >= 0, got {step!r}")


def _is_int(value, minimum):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= minimum


def _layout(specs):
    """Byte offsets of each piece in one buffer (aligned), and the buffer's size."""
    offsets, end = {}, 0
    for name, (shape, dtype) in specs.items():
        offsets[name] = end
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        end += -(-nbytes // _ALIGN) * _ALIGN
    return offsets, end


def _views(buffer, specs, offsets):
    views = {}
    for name, (shape, dtype) in specs.items():
        start, nbytes = offsets[name], int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        views[name] = buffer[start:start + nbytes].view(dtype).reshape(shape)
    return views


class SnapshotPool:
    """Buffers for pull snapshots, reused once nobody holds them any more.

    A snapshot is sent zero-copy, so ZeroMQ keeps a reference until the bytes are out; a
    buffer whose only reference is the pool's can be overwritten. Reusing them spares the
    page faults of a fresh allocation: 108 ms per pull of 64 MB against 14 ms warm.
    """

    def __init__(self, nbytes, keep=3):
        self.nbytes, self.keep, self.buffers = nbytes, keep, []

    def take(self):
        for i in range(len(self.buffers)):
            if sys.getrefcount(self.buffers[i]) == 2:  # the list's reference and the call's argument
                return self.buffers[i]
        buffer = np.empty(self.nbytes, np.uint8)
        if len(self.buffers) < self.keep:
            self.buffers.append(buffer)
        return buffer


def _read_only(view):
    view.flags.writeable = False
    return view
