"""The ps-shard service: messages in, calls out on the shard's update rule (rules.py) and the store
of its variables (store.py).

Each op's args, answer and role: common/wire/protocol.py's PsOps (docs/protocol.md).

Lost replicas (sync): while pulls wait for a step, a replica the step misses that has said nothing
for `lost_after` seconds (no push, no request, no heartbeat of its client) is lost. By `lost_policy`
the shard goes on without it (`continue`: steps need one replica fewer, and it rejoins when heard
from again) or fails every waiting pull with ABORTED naming it (`abort`), so no worker hangs.

Shared variables (store.py's SharedVariables): any member of the job creates, reads and changes them by
(container, name) on the shard the placement names (`shared_variable_shard` over `num_shards`, so a
client counting another number of shards is told, not served a second copy); `reset` (an admin op, as
the broker's) frees a container's. They live outside the model: never pulled, pushed or optimized, and
ready before the model is initialized. Checkpoints keep them beside the shard's pieces.
"""

import logging
import os
import time

import numpy as np

from zmqflow.common.errors import (AbortedError, AlreadyExistsError, DeadlineExceededError, FailedPreconditionError,
                                   InvalidArgumentError, NotFoundError, PermissionDeniedError, ResourceExhaustedError)
from zmqflow.common.rpc.service import PARKED, Service
from zmqflow.common.checkpoints import checkpoint
from zmqflow.common.cluster.placement import shared_variable_shard
from zmqflow.common.wire.dtypes import BFLOAT16, as_numpy, is_bfloat16, name_of
from zmqflow.common.wire.frames import EncodedReply, SentTensor, pack_tensors
from zmqflow.services.ps.rules import PARK, RELEASE, update_rule
from zmqflow.services.ps.store import SharedVariables, VariableStore, shared_name
from zmqflow.common.wire.protocol import PsOps

log = logging.getLogger(__name__)
LOST_POLICIES = ("continue", "abort")
LOST_CHECK_S = 0.5   # how often waiting pulls make the shard look for lost replicas
MAX_PRELOAD_BYTES = 1 << 30
"""What a shard holds of preloaded data sets in all by default (--max-preload-bytes): MNIST's training
set is 47 MB as float32; a bigger data set belongs in readers and the broker."""
MAX_SHARED_VARIABLE_BYTES = 1 << 30
"""What a shard holds of shared variables in all by default (--max-shared-variable-bytes)."""


class PsService(Service):
    name = "ps-shard"
    protocol = PsOps

    def __init__(self, bind, shard_index, pieces, state_options, lost_after=5.0, lost_policy="continue",
                 trainable=None, checkpoint_root=None, max_preload_bytes=MAX_PRELOAD_BYTES, num_shards=1,
                 max_shared_variable_bytes=MAX_SHARED_VARIABLE_BYTES, **service_options):
        super().__init__(bind, **service_options)
        if lost_policy not in LOST_POLICIES:
            raise InvalidArgumentError(f"lost_policy must be one of {', '.join(LOST_POLICIES)}, got {lost_policy!r}")
        self.lost_after, self.lost_policy = lost_after, lost_policy
        self._identity_of = {}     # replica -> the routing id of its last push (whose heartbeats say it lives)
        self._aborted = None       # lost_policy abort: why every pull now fails
        self._lost_check_at = None
        self.shard_index = shard_index
        self.pieces = pieces  # {key: Piece} of this shard, in placement order
        options = dict(state_options)
        self.store = VariableStore({k: (p.shape, p.dtype) for k, p in pieces.items()}, options.pop("optimizer"))
        self.rule = update_rule(self.store, live=lambda call: not call.finished, **options)
        self.names = list(pieces)
        self._packed_pull = None   # ((generation, bf16), fields, [SentTensor], EncodedReply): the last full packed pull
        self._ready_waiters = []
        self.preloaded = {}  # name -> {component: array}: a data set held once, never trained
        self.max_preload_bytes = max_preload_bytes
        if not isinstance(num_shards, int) or not 0 <= shard_index < num_shards:
            raise InvalidArgumentError(f"ps:{shard_index} is no shard of {num_shards!r} (--task-index, --num-ps)")
        self.num_shards = num_shards
        self.shared = SharedVariables(max_shared_variable_bytes)
        # `assign` sets non-trainable pieces only (BatchNorm's statistics): the trainable ones move by pushes,
        # through the optimizer and the non-finite policy. None: every variable is trainable.
        self.trainable = {k for k, p in pieces.items() if trainable is None or p.variable in trainable}
        # `save` writes only below this directory (the job's checkpoints), never through a symbolic link
        self.checkpoint_root = os.path.abspath(checkpoint_root or os.getcwd())
        self.serve({PsOps.Init: self._init, PsOps.Restore: self._restore, PsOps.WaitReady: self._wait_ready,
                    PsOps.Pull: self._pull, PsOps.Push: self._push, PsOps.PushSparse: self._push_sparse,
                    PsOps.PullRows: self._pull_rows, PsOps.Assign: self._assign, PsOps.Save: self._save,
                    PsOps.WorkerDone: self._worker_done, PsOps.Join: self._join, PsOps.Stats: self._stats, PsOps.Preload: self._preload,
                    PsOps.TakeRows: self._take_rows, PsOps.Shutdown: self._shutdown,
                    PsOps.CreateVariable: self._create_variable, PsOps.ReadVariable: self._read_variable,
                    PsOps.AssignVariable: self._assign_variable, PsOps.AssignAddVariable: self._assign_add_variable,
                    PsOps.ScatterAddVariable: self._scatter_add_variable, PsOps.ListVariables: self._list_variables,
                    PsOps.Reset: self._reset})

    # ------------------------------------------------ initialization

    def _init(self, call):
        values = self._named_tensors(call)
        self.store.initialize(values, step=call.args.step, force=call.args.force)
        self._wake_ready()
        return {"version": self.store.version}

    def _restore(self, call):
        result = self.restore_latest(call.args.dir, call.args.path)
        if call.args.at_least is not None:  # in step with the shards that kept their state: versions never go back
            self.store.advance_to(call.args.at_least)
            self._wake_versions()
            result["version"] = self.store.version
        return result

    def restore_latest(self, directory, path=None):
        """Load this shard's rows of the latest checkpoint in `directory` (any shard count)."""
        path = path or checkpoint.latest_checkpoint(directory)
        if path is None:
            raise FailedPreconditionError(f"no checkpoint in {directory!r}")
        ckpt = checkpoint.Checkpoint(path)
        values, slots = {}, {}
        for key, piece in self.pieces.items():
            values[key], slots[key] = ckpt.read_rows(piece.variable, piece.row_start, piece.row_end)
        shared = {key: ckpt.read_shared(*key) for key in ckpt.shared_variables()
                  if shared_variable_shard(*key, self.num_shards) == self.shard_index}
        self.store.restore(values, slots, ckpt.step)
        self.shared.replace(shared)
        self._wake_ready()
        log.info("ps:%d restored %d pieces at step %d from %s, and %d shared variables", self.shard_index,
                 len(values), ckpt.step, path, len(shared))
        return {"version": self.store.version, "path": str(path)}

    def _wait_ready(self, call):
        if self.store.initialized:
            return {"version": self.store.version}
        self._ready_waiters.append(call)
        return self.park(call)

    def _wake_ready(self):
        for call in self._ready_waiters:
            self.reply(call, {"version": self.store.version})
        self._ready_waiters = []
        self._wake_versions()

    # ------------------------------------------------ pull and push

    def _pull(self, call):
        self._require_ready()
        min_version = call.args.min_version
        if self._aborted is not None and min_version is not None:
            raise AbortedError(self._aborted)
        released = self._wait_for_version(call, min_version)
        return released if released is PARKED else self._pull_answer(call, released)

    def _wait_for_version(self, call, min_version):
        """Sync's wait for a step: PARKED when `call` now waits until the shard reaches `min_version`; else
        whether its answer now is a released one (a step that can never complete)."""
        decision = self.rule.on_pull(min_version)
        if decision != PARK:
            return decision == RELEASE
        self.rule.park(call, min_version)
        self._schedule_lost_check()
        return self.park(call)

    def _pull_answer(self, call, released=False):
        args = call.args   # names: a subset (a worker leaves out the tables it reads by rows)
        result, tensors = self._variables_answer(args.names, args.newer_than, args.bf16, args.packed, released)
        cached = self._packed_pull
        if tensors and not released and cached is not None and tensors is cached[2]:
            return cached[3], ()   # every worker's pull at this version: its reply's header and frame, encoded once
        return result, tensors

    def _variables_answer(self, names, newer_than=None, bf16=False, packed=False, released=False):
        """(result, tensors) of a pull: the variables `names` (None: every piece) one tensor each, or `packed` in
        one frame (the snapshot buffer itself when it can: common/wire/frames.py)."""
        version, values = self.store.pull(names, newer_than=newer_than)
        result = {"version": version, "released": released}
        if values is None:
            return result, ()
        if packed and names is None:   # every worker's pull: the same answer until the values move
            key = (self.store.generation, bf16)
            cached = self._packed_pull
            if cached is None or cached[0] != key:
                fields, (frame,) = self._packed_answer(self.names, values, bf16)
                sent = [SentTensor(frame)]
                answer = EncodedReply({"version": version, "released": False, **fields}, sent)   # not a released wait's
                cached = self._packed_pull = (key, fields, sent, answer)
            return {**result, **cached[1]}, cached[2]
        names = self.names if names is None else names
        if packed:
            fields, tensors = self._packed_answer(names, values, bf16)
            return {**result, **fields}, tensors
        tensors = [values[n] for n in names]
        if bf16:
            tensors = [t.astype(as_numpy(BFLOAT16)) for t in tensors]
        return {**result, "names": names}, tensors

    @staticmethod
    def _packed_answer(names, values, bf16):
        """({names, layout}, [frame]): the variables `names` in one frame."""
        tensors = [values[n] for n in names]
        if bf16:
            tensors = [t.astype(as_numpy(BFLOAT16)) for t in tensors]
        layout, frame = pack_tensors(tensors)
        return {"names": names, "layout": layout}, [frame]

    # ------------------------------------------------ lost replicas (sync)

    def _heard_from(self, replica, identity):
        self._identity_of[replica] = identity
        if self.rule.heard_from(replica, time.monotonic()):
            log.warning("ps:%d: replica %d is back: steps wait for it again", self.shard_index, replica)

    def _schedule_lost_check(self):
        if self.lost_after is None or self.rule.mode != "sync":
            return
        now = time.monotonic()
        if self._lost_check_at is None or self._lost_check_at <= now:
            self._lost_check_at = now + LOST_CHECK_S
            self.wake_at(self._lost_check_at)

    def _expire(self, now):
        super()._expire(now)
        if self._lost_check_at is not None and now >= self._lost_check_at:
            self._lost_check_at = None
            self._check_lost(now)
            if self.rule.parked:
                self._schedule_lost_check()

    def _check_lost(self, now):
        """A replica the current step misses, silent past `lost_after`: lost, by the policy."""
        if not self.rule.parked or self._aborted is not None:
            return
        for replica, silent in self.rule.silent(now, self.lost_after,
                                                lambda r: self._last_seen.get(self._identity_of[r], 0.0)):
            self._lose(replica, silent)

    def _lose(self, replica, silent):
        if self.lost_policy == "abort":
            self._aborted = (f"ps:{self.shard_index}: replica {replica} was lost (silent for {silent:.1f} s) and "
                             "this sync job cannot go on without it (lost_policy abort)")
            log.error("%s", self._aborted)
            for call in self.rule.release_all():
                self.fail(call, AbortedError(self._aborted))
            return
        result = self.rule.lose_replica(replica)
        log.warning("ps:%d: replica %d silent for %.1f s: lost; steps go on with %d replicas", self.shard_index,
                    replica, silent, self.rule.needed())
        if result is not None:
            self._wake_versions()
        if self.rule.step_cannot_complete():   # the others are done: nobody is left to complete a step
            self._release(self.rule.release_all())

    def _wake_versions(self):
        for call in self.rule.due():
            self.reply(call, *self._waiter_answer(call))

    def _waiter_answer(self, call, released=False):
        """The answer of a parked wait for a version: a pull's, or a push's that waits for its sync step
        (its push result, then the variables as a packed pull gives them)."""
        if call.op != PsOps.Push.OP:
            return self._pull_answer(call, released)
        pulled, tensors = self._variables_answer(None, bf16=call.args.bf16, packed=True, released=released)
        return {**call.state, **pulled}, tensors

    def on_deadline(self, call):
        if call.op in (PsOps.Pull.OP, PsOps.Push.OP):
            wait = self.rule.waiting_for()
            self.fail(call, DeadlineExceededError(
                f"ps:{self.shard_index} still at version {self.store.version} (waiting for {call.args.min_version}): "
                f"step {wait.get('step')} has gradients from replicas {wait.get('contributed')} and misses "
                f"{wait.get('missing')}"))
        elif call.op == "wait_ready":
            self.fail(call, DeadlineExceededError(f"ps:{self.shard_index} not initialized yet: the chief has not "
                                                  "initialized or restored the variables"))
        else:
            super().on_deadline(call)

    def _push(self, call):
        """Tensors: one per name in `names` (dense gradients), then (indices, rows) for each piece
        named in `sparse` (the rows of an embedding table the batch touched)."""
        self._require_ready()
        sparse_names = call.args.sparse
        dense_count = len(call.tensors) - 2 * len(sparse_names)
        if dense_count < 0:
            raise InvalidArgumentError(f"push names {len(sparse_names)} sparse pieces but carries "
                                       f"{len(call.tensors)} tensors; each sparse piece takes two")
        grads = self._named_tensors(call, call.tensors[:dense_count])
        sparse = {name: (call.tensors[dense_count + 2 * k], _float32(call.tensors[dense_count + 2 * k + 1]))
                  for k, name in enumerate(sparse_names)}
        min_version = call.args.min_version
        if min_version is not None and self._aborted is not None:
            raise AbortedError(self._aborted)
        result = self._pushed(call, self.rule.push, grads, sparse=sparse)
        if not call.args.pull:
            return result
        if min_version is not None and result["reason"] != "not_member":
            # a sync step's exchange in one round trip: the variables once the step this push is part of is
            # applied, parked as a Pull(min_version) would be (a replica left out of the steps hears so at once)
            call.state = result   # what the answer carries besides the variables (_waiter_answer)
            released = self._wait_for_version(call, min_version)
            if released is PARKED:
                call.tensors = ()   # the gradients are in the step's sums: let go of them
                return PARKED
            return self._waiter_answer(call, released)
        pulled, tensors = self._variables_answer(None, bf16=call.args.bf16, packed=True)   # after this push
        return {**result, "names": pulled["names"], "layout": pulled["layout"]}, tensors

    def _push_sparse(self, call):
        self._require_ready()
        if len(call.tensors) != 2:
            raise InvalidArgumentError("push_sparse takes two tensors: indices and rows")
        indices, rows = call.tensors
        return self._pushed(call, self.rule.push_sparse, call.args.name, indices, _float32(rows))

    def _pushed(self, call, push, *tensors, **sparse):
        """`push` (the rule's) of what `call` carries, tagged with its version and replica; the pulls it let go."""
        self._heard_from(call.args.replica, call.identity)
        result = push(*tensors, version=call.args.version, replica=call.args.replica, **sparse)
        self._wake_versions()
        return vars(result)

    def _assign(self, call):
        """New values of non-trainable pieces only, finite unless the policy skips them (then nothing changes)."""
        self._require_ready()
        values = self._named_tensors(call)
        trainable = sorted(set(values) & self.trainable)
        if trainable:
            raise PermissionDeniedError(f"assign sets non-trainable variables only; {trainable[0]!r} is trainable "
                                        "(its values change by pushed gradients, through the optimizer)")
        bad = next((n for n, v in values.items() if v.dtype.kind == "f" and not np.isfinite(v).all()), None)
        if bad is not None:
            if self.rule.nonfinite == "refuse":
                raise InvalidArgumentError(f"assigned value of {bad!r} holds NaN or Inf: refused, the variables are "
                                           "unchanged (the ps runs with nonfinite=refuse)")
            return {"assigned": 0, "version": self.store.version}
        return {"assigned": self.store.assign(values), "version": self.store.version}

    def _pull_rows(self, call):
        self._require_ready()
        if len(call.tensors) != 1:
            raise InvalidArgumentError("pull_rows takes one tensor: the row indices")
        rows = self.store.pull_rows(call.args.name, call.tensors[0])
        return {"version": self.store.version}, [rows]

    # ------------------------------------------------ preloaded data (the seeds' preloading)

    def _preload(self, call):
        """Hold a small data set as non-trainable tensors that workers slice by row."""
        name, data = call.args.name, self._named_tensors(call)
        rows = {len(t) if t.ndim else -1 for t in data.values()}
        if len(rows) != 1 or -1 in rows:
            raise InvalidArgumentError(f"preloaded data {name!r}: every component needs the same number of rows")
        if name in self.preloaded:
            raise AlreadyExistsError(f"ps:{self.shard_index} already holds preloaded data {name!r}; it is never "
                                     "replaced (workers may be slicing it): preload under another name")
        held = sum(t.nbytes for d in self.preloaded.values() for t in d.values())
        size = sum(t.nbytes for t in data.values())
        if held + size > self.max_preload_bytes:
            raise ResourceExhaustedError(f"preloaded data {name!r} of {size} bytes: ps:{self.shard_index} holds "
                                         f"{held} and preloads at most {self.max_preload_bytes} bytes in all "
                                         "(--max-preload-bytes)")
        self.preloaded[name] = data
        log.info("ps:%d holds preloaded data %r: %d rows, %d bytes", self.shard_index, name, rows.pop(),
                 sum(t.nbytes for t in data.values()))
        return {"rows": len(next(iter(data.values()))), "names": list(data)}

    def _take_rows(self, call):
        name = call.args.name
        data = self.preloaded.get(name)
        if data is None:
            raise NotFoundError(f"ps:{self.shard_index} holds no preloaded data {name!r}")
        if len(call.tensors) != 1 or call.tensors[0].dtype.kind not in "iu":
            raise InvalidArgumentError("take_rows takes one integer tensor: the row indices")
        indices = call.tensors[0]
        rows = len(next(iter(data.values())))
        if indices.size and (indices.min() < 0 or indices.max() >= rows):
            raise InvalidArgumentError(f"row indices of {name!r} must be in [0, {rows})")
        return {"names": list(data), "rows": rows}, [t[indices] for t in data.values()]

    # ------------------------------------------------ shared variables (TF's resource containers)

    def _shared_key(self, call):
        """(container, name) of a shared-variable op, bounded and placed on this shard."""
        container, name = call.args.container, call.args.name
        for field, value in (("name", name), ("container", container)):
            if len(value) > self.limits.max_name_length:
                raise InvalidArgumentError(f"{call.op}'s {field} is longer than {self.limits.max_name_length} "
                                           "characters")
        shard = shared_variable_shard(container, name, self.num_shards)
        if shard != self.shard_index:
            raise InvalidArgumentError(f"shared variable {shared_name(container, name)} lives on ps:{shard} of "
                                       f"{self.num_shards}, not on ps:{self.shard_index}: the client counts another "
                                       "number of ps tasks than the job")
        return container, name

    def _tensors(self, call, *names):
        if len(call.tensors) != len(names):
            takes = f"{len(names)} tensor{'s' * (len(names) > 1)} ({', '.join(names)})" if names else "no tensors"
            raise InvalidArgumentError(f"{call.op} takes {takes}, got {len(call.tensors)}")
        return call.tensors

    def _variable_answer(self, value, read_value=True):
        answer = {"dtype": name_of(value), "shape": list(value.shape)}
        return (answer, [value.copy()]) if read_value else answer

    def _create_variable(self, call):
        key = self._shared_key(call)
        value, = self._tensors(call, "the initial value")
        created = self.shared.create(*key, value)
        if created:
            log.info("ps:%d holds shared variable %s: %s %s", self.shard_index, shared_name(*key), name_of(value),
                     list(value.shape))
        return {"created": created, **self._variable_answer(self.shared.read(*key), read_value=False)}

    def _read_variable(self, call):
        self._tensors(call)
        return self._variable_answer(self.shared.read(*self._shared_key(call)))

    def _assign_variable(self, call):
        key = self._shared_key(call)
        value, = self._tensors(call, "the new value")
        return self._variable_answer(self.shared.assign(*key, value), call.args.read_value)

    def _assign_add_variable(self, call):
        key = self._shared_key(call)
        delta, = self._tensors(call, "what to add")
        return self._variable_answer(self.shared.assign_add(*key, delta), call.args.read_value)

    def _scatter_add_variable(self, call):
        key = self._shared_key(call)
        indices, updates = self._tensors(call, "indices", "updates")
        return self._variable_answer(self.shared.scatter_add(*key, indices, updates), call.args.read_value)

    def _list_variables(self, call):
        return {"variables": self.shared.list(call.args.container)}

    def _reset(self, call):
        container = call.args.container
        freed = self.shared.reset(container)
        log.info("ps:%d freed %d shared variables of container %r (reset)", self.shard_index, freed, container)
        return {"container": container, "freed": freed}

    # ------------------------------------------------ checkpoints, end of training

    def _save(self, call):
        self._require_ready()
        own_step, values, slots = self.store.snapshot_for_checkpoint()
        step = own_step if call.args.step is None else call.args.step  # the chief's global step names it
        directory = self._checkpoint_dir(call.args.dir, step)
        try:
            checkpoint.write_shard(directory, step, self.shard_index, {k: (self.pieces[k], values[k], slots[k])
                                                                           for k in self.names},
                                   metadata=call.args.metadata or {}, shared=self.shared.snapshot())
        except (OSError, ValueError) as exc:  # a directory that cannot be written (too long, a NUL): the caller's to fix
            raise FailedPreconditionError(f"ps:{self.shard_index} cannot write checkpoint {step} in "
                                          f"{call.args.dir!r:.120}: {getattr(exc, 'strerror', None) or exc}") from None
        return {"step": step}

    def _checkpoint_dir(self, directory, step):
        """`directory` when it lies in the checkpoint root and no symbolic link leads there (nor is the staging
        folder of `step` one; its files are written by rename), else PermissionDenied: a peer cannot make the
        ps write where it chooses."""
        path = os.path.abspath(directory)
        root = next((r for r in (self.checkpoint_root, os.path.realpath(self.checkpoint_root))
                     if os.path.commonpath([r, path]) == r), None)
        where = f"ps:{self.shard_index} saves checkpoints only in {self.checkpoint_root} (--checkpoint-root)"
        if root is None:
            raise PermissionDeniedError(f"{where}, not in {directory!r:.200}")
        current = root
        for part in [*os.path.relpath(path, root).split(os.sep), checkpoint.staging_name(step)]:
            current = current if part == "." else os.path.join(current, part)
            if os.path.islink(current):
                raise PermissionDeniedError(f"{where}, never through a symbolic link: {current!r:.200} is one")
        return path

    def _join(self, call):
        """A replica (a worker joining mid-training, or starting) asks from which step its pushes count."""
        self._require_ready()
        step = self.rule.join(call.args.replica, call.args.step)
        self._heard_from(call.args.replica, call.identity)   # silent from now on: lost like any member
        if self.rule.elastic:
            log.info("ps:%d: replica %d joins at step %d (now at %d, members %s)", self.shard_index,
                     call.args.replica, step, self.store.version, sorted(self.rule.members))
        return {"step": step, "version": self.store.version, "elastic": self.rule.elastic}

    def _worker_done(self, call):
        self._release(self.rule.worker_done(call.args.replica, lost=call.args.lost))
        self._wake_versions()   # elastic sync: the step may have been waiting only for the replica that left
        return {"done": sorted(self.rule.done), "lost": self.rule.given_up()}

    def _release(self, waiters):
        """Answer parked sync waits now, marked `released`: their step will never complete."""
        for waiter in waiters:
            self.reply(waiter, *self._waiter_answer(waiter, released=True))

    def _stats(self, call):
        now = time.monotonic()
        return {"shard": self.shard_index, "initialized": self.store.initialized, **self.rule.stats(),
                "done_workers": sorted(self.rule.done), "lost_workers": self.rule.given_up(),
                "shared_variables": len(self.shared), "shared_variable_bytes": self.shared.nbytes,
                "replica_idle_s": {str(r): round(idle, 3) for r, idle in self.rule.idle_seconds(now).items()}}

    def _shutdown(self, call):
        log.info("ps:%d shutting down at version %d (asked by the chief)", self.shard_index, self.store.version)
        self._release(self.rule.release_all())  # nobody is left waiting on a shard that is gone
        self.stop()
        return {"version": self.store.version}

    def describe(self):
        return {"shard": self.shard_index, "version": self.store.version, "initialized": self.store.initialized}

    def metric_families(self):
        """The shard's counters for Prometheus, read from its stats at scrape time (common/processes/metrics.py)."""
        from zmqflow.common.processes.metrics import counter_family, gauge_family, histogram_family
        stats, shard, now = self.rule.stats(), (str(self.shard_index),), time.monotonic()
        yield gauge_family("zmqflow_ps_version", "The shard's version (global step).", {shard: stats["version"]},
                           ["shard"])
        for name, key, doc in (("updates", "updates", "Updates applied to the variables."),
                               ("pushes_received", "pushes_received", "Gradient pushes received."),
                               ("pushes_applied", "pushes_applied", "Pushes applied."),
                               ("pulls", "pulls", "Pulls answered."),
                               ("pushed_bytes", "bytes_pushed", "Gradient bytes received."),
                               ("pulled_bytes", "bytes_pulled", "Parameter bytes sent.")):
            yield counter_family(f"zmqflow_ps_{name}", doc, {shard: stats[key]}, ["shard"])
        yield gauge_family("zmqflow_ps_pushes_pending", "Sync: pushes accumulated for the current step.",
                           {shard: stats["pushes_pending"]}, ["shard"])
        yield counter_family("zmqflow_ps_pushes_dropped", "Pushes dropped, by reason (stale, duplicate, future, ...).",
                             {(*shard, reason): n for reason, n in stats["dropped"].items()}, ["shard", "reason"])
        staleness = stats["staleness"]
        bounds = (0, 1, 2, 4, 8, 16, 32, 64)
        counts = [sum(n for s, n in staleness.items() if (bounds[i - 1] if i else -1) < s <= b)
                  for i, b in enumerate(bounds)] + [sum(n for s, n in staleness.items() if s > bounds[-1])]
        yield histogram_family("zmqflow_ps_push_staleness_steps",
                               "Staleness (versions behind) of the pushes received.", ["shard"],
                               {shard: (sum(s * n for s, n in staleness.items()), counts)}, bounds)
        yield gauge_family("zmqflow_ps_done_workers", "Workers that reported done (lost ones included).",
                           {shard: len(self.rule.done)}, ["shard"])
        wall = time.time()  # a timestamp, not an age: `time() - zmqflow_ps_replica_last_push_timestamp_seconds`
        yield gauge_family("zmqflow_ps_replica_last_push_timestamp_seconds", "Unix time of each replica's last push.",
                           {(*shard, str(r)): wall - idle for r, idle in self.rule.idle_seconds(now).items()},
                           ["shard", "replica"])

    # ------------------------------------------------ helpers

    def _require_ready(self):
        if not self.store.initialized:
            raise FailedPreconditionError(f"variables of ps:{self.shard_index} are not initialized; "
                                          "the chief initializes or restores them")

    def _named_tensors(self, call, tensors=None):
        tensors = call.tensors if tensors is None else tensors
        names = call.args.names
        if len(names) != len(tensors):
            raise InvalidArgumentError(f"'names' must list one name per tensor ({len(tensors)} tensors)")
        return {n: _float32(t) for n, t in zip(names, tensors)}


def _float32(tensor):
    """A bfloat16 tensor (a `bf16` request's) as float32, what the variables hold; any other as it is."""
    return tensor.astype(np.float32) if is_bfloat16(tensor.dtype) else tensor

