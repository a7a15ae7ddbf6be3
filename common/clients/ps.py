"""Talk to all ps shards at once: one pull and one push per shard per step, in flight together.

The client knows the placement (computed from the same variable list as the
shards, no coordination), so it splits gradients into the shards' pieces and
assembles partitioned variables back from their row blocks. Each shard keeps
its own version; the global step is ps 0's.

`SharedVariables` and `SharedVariable` are the other kind the shards hold: variables outside the model
that any client of the job creates and changes by (container, name), TF's variables in resource
containers (common/clients/containers.py), each on the shard `shared_variable_shard` names.
"""

import numpy as np

from zmqflow.common.clients.containers import check_container, containers_of, current_container
from zmqflow.common.cluster.placement import shared_variable_shard
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.rpc.client import USE_DEFAULT, OpClient, RpcClient, default_pool
from zmqflow.common.rpc.probe import endpoint_of
from zmqflow.common.variables import IndexedSlices
from zmqflow.common.wire.dtypes import BFLOAT16, as_numpy, is_bfloat16, name_of_or_str, to_array
from zmqflow.common.wire.frames import PackedLayouts
from zmqflow.common.wire.protocol import PsOps



class PsShardClient(OpClient):
    """One shard's own ops, for jobs and tools (the training step talks to every shard: PsClient)."""

    def __init__(self, address, timeout=30.0, name="ps-client", **rpc_options):
        super().__init__(address, timeout, name, **rpc_options)

    def stats(self, timeout=5.0):
        """version (the global step on ps 0), pushes, pulls, workers heard from, ..."""
        return self.rpc.call(PsOps.Stats(), timeout=timeout)[0]

    def shutdown(self, timeout=5.0):
        """Ask the shard to exit 0 (an admin op: CURVE or the admin token)."""
        return self.rpc.call(PsOps.Shutdown(), timeout=timeout)[0]

    def preload(self, name, data, timeout=60.0):
        """Hold `data` ({component: array with rows}) on this shard, for workers to slice."""
        return self.rpc.call(PsOps.Preload(name, list(data)), tensors=list(data.values()), timeout=timeout)[0]


class PsClient:
    def __init__(self, endpoints, placement, bf16=False, timeout=30.0, name="worker"):
        self.endpoints = list(endpoints)
        self.placement = placement
        self.bf16 = bf16
        self.timeout = timeout
        self.clients = [RpcClient(e, default_timeout=timeout, name=f"{name}-ps{i}") for i, e in enumerate(self.endpoints)]
        self.shard_keys = [[p.key for p in placement.for_shard(i)] for i in range(len(self.endpoints))]
        self.versions = [0] * len(self.endpoints)
        self._layouts = [PackedLayouts(c.limits) for c in self.clients]   # each shard's packed pull, checked once
        self._parts = {}  # the last value of every piece: a pull_if_newer fills in only what changed
        self._model = None

    # ------------------------------------------------ start-up

    def initialize(self, values, step=0):
        """Chief: send every shard the initial values of its pieces."""
        pieces = self._split(values)
        calls = [c.submit(PsOps.Init(keys, step), tensors=[pieces[k] for k in keys])
                 for c, keys in zip(self.clients, self.shard_keys)]
        return [call.result()[0]["version"] for call in calls]

    def restore(self, directory, shards=None, at_least=None):
        """Chief: the shards (indices; default every one) load their rows of the latest checkpoint in
        `directory`, their version raised to `at_least` when given (the others' current version)."""
        return self._on_shards(PsOps.Restore(str(directory), at_least=None if at_least is None else int(at_least)),
                               shards)

    def wait_ready(self, timeout=60.0):
        return [result["version"] for result in self._on_shards(PsOps.WaitReady(), timeout=timeout)]

    def _on_shards(self, request, shards=None, timeout=USE_DEFAULT):
        """`request` sent to the shards (indices; default every one) at once; their answers, in that order."""
        shards = range(len(self.clients)) if shards is None else shards
        calls = [self.clients[i].submit(request, timeout=timeout) for i in shards]
        return [call.result()[0] for call in calls]

    # ------------------------------------------------ the step

    def pull_async(self, min_version=None, timeout=None, exclude=()):
        """`min_version`: an int for every shard or a list, one per shard (sync: wait for the step).
        `exclude`: variables left out (the embedding tables a worker reads by rows)."""
        return self._pull_all(self._per_shard(min_version), None, timeout, frozenset(exclude))

    def pull(self, min_version=None, timeout=None, exclude=()):
        """{variable: value} of the whole model (less `exclude`); sets `versions`."""
        return self.pull_async(min_version, timeout, exclude).result()

    def pull_if_newer(self, timeout=None):
        """Like pull, but shards whose version did not move since our last pull send no tensors;
        returns None when nothing changed anywhere, else the whole model from `cache`."""
        return self._pull_all(None, list(self.versions), timeout, frozenset()).result()

    def _pull_all(self, min_versions, newer_than, timeout, exclude):
        unknown = sorted(set(exclude) - set(self.placement.variables())) if exclude else ()
        if unknown:
            raise InvalidArgumentError(f"cannot leave out {unknown} of a pull: not variables of the model")
        calls = []
        for i, client in enumerate(self.clients):
            request = PsOps.Pull(self.bf16, None if min_versions is None else min_versions[i],
                                 None if newer_than is None else newer_than[i],
                                 [p.key for p in self.placement.for_shard(i) if p.variable not in exclude] if exclude
                                 else None, packed=True)
            calls.append(client.submit(request, timeout=timeout or self.timeout))
        return _Gathered(calls, lambda replies: self._assemble_pull(replies, exclude))

    def _per_shard(self, value):
        if value is None or isinstance(value, (list, tuple)):
            return value
        return [value] * len(self.clients)

    # ------------------------------------------------ rows of embedding-like variables

    def _row_routes(self, variable, indices):
        """[(piece, positions in `indices`, row ids local to the piece)] for each row block of
        `variable` that `indices` touch: an embedding table split over shards is read and
        updated where its rows live."""
        pieces = self.placement.pieces_of(variable)
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        rows = pieces[-1].row_end
        if indices.size and (indices.min() < 0 or indices.max() >= rows):
            raise InvalidArgumentError(f"row indices of {variable!r} must be in [0, {rows}), got "
                                       f"{int(indices.min())}..{int(indices.max())}")
        block = np.searchsorted([p.row_start for p in pieces], indices, side="right") - 1
        routes = []
        for i, piece in enumerate(pieces):
            positions = np.flatnonzero(block == i)
            if positions.size:
                routes.append((piece, positions, indices[positions] - piece.row_start))
        return routes

    def pull_rows(self, variable, indices):
        """Rows `indices` of `variable` (in that order), from every shard that holds some of them."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        pieces = self.placement.pieces_of(variable)
        calls = [(positions, self.clients[piece.shard].submit(PsOps.PullRows(piece.key), tensors=[local]))
                 for piece, positions, local in self._row_routes(variable, indices)]
        parts = [(positions, call.result()[1][0]) for positions, call in calls]
        dtype = parts[0][1].dtype if parts else np.dtype(pieces[0].dtype)
        out = np.empty((len(indices),) + tuple(pieces[0].shape[1:]), dtype=dtype)
        for positions, rows in parts:
            out[positions] = rows
        return out

    def push_sparse(self, variable, indices, rows, replica=0):
        """Gradient rows for rows `indices` of `variable`, each part to the shard holding its rows,
        tagged with that shard's last pulled version; one result per shard reached."""
        rows = np.asarray(rows)
        calls = []
        for piece, positions, local in self._row_routes(variable, indices):
            part = rows[positions].astype(as_numpy(BFLOAT16)) if self.bf16 else rows[positions]
            calls.append(self.clients[piece.shard].submit(
                PsOps.PushSparse(piece.key, self.versions[piece.shard], replica), tensors=[local, part]))
        results = [call.result()[0] for call in calls]
        return results[0] if len(results) == 1 else results

    def push_async(self, grads, replica=0, pull=False, min_version=None, timeout=None):
        """One push per shard, tagged with the versions of the last pull. A gradient given as
        IndexedSlices (an embedding table's touched rows) travels as rows to the shards holding
        them; every shard holding part of the table gets its rows (maybe none) in the same push.
        `pull`: every shard answers with its variables after the push too, so the result is
        (one result per shard, {variable: value} as `pull` gives): a step's exchange in one round trip.
        With `min_version` (an int for every shard or one per shard), each answers once it reaches it, as
        `pull(min_version)` does: a sync step's push and wait in one round trip."""
        min_versions = self._per_shard(min_version)
        sparse = {name: g for name, g in grads.items() if isinstance(g, IndexedSlices)}
        pieces = self._split({name: g for name, g in grads.items() if name not in sparse})
        rows = {piece.key: (np.zeros(0, np.int64), np.zeros((0,) + tuple(piece.shape[1:]), piece.dtype))
                for name in sparse for piece in self.placement.pieces_of(name)}
        for name, g in sparse.items():
            values = np.asarray(g.values)
            for piece, positions, local in self._row_routes(name, g.indices):
                rows[piece.key] = (local, values[positions])
        calls = []
        for i, (client, keys) in enumerate(zip(self.clients, self.shard_keys)):
            dense = [k for k in keys if k not in rows]
            mine = [k for k in keys if k in rows]
            tensors = [pieces[k] for k in dense]
            for k in mine:
                tensors += list(rows[k])
            if self.bf16:
                tensors = [t.astype(as_numpy(BFLOAT16)) if t.dtype.kind == "f" else t for t in tensors]
            request = PsOps.Push(self.versions[i], dense, replica, mine or None, self.bf16, pull or None,
                                 None if min_versions is None else min_versions[i])
            calls.append(client.submit(request, tensors=tensors, timeout=timeout or self.timeout))
        if pull:
            return _Gathered(calls, lambda replies: ([r[0] for r in replies], self._assemble_pull(replies)))
        return _Gathered(calls, lambda replies: [r[0] for r in replies])

    def push(self, grads, replica=0):
        """Push gradients tagged with the versions of the last pull; one result per shard."""
        return self.push_async(grads, replica).result()

    def assign_async(self, values):
        """Set non-trainable variables ({name: value}) on the shards that hold them."""
        pieces = self._split(values)
        calls = []
        for client, keys in zip(self.clients, self.shard_keys):
            mine = [k for k in keys if k in pieces]
            if mine:
                calls.append(client.submit(PsOps.Assign(mine), tensors=[pieces[k] for k in mine]))
        return _Gathered(calls, lambda replies: [r[0] for r in replies])

    # ------------------------------------------------ preloaded data

    def preloaded_rows(self, name, shard=0, timeout=120.0):
        """Rows of the preloaded data set `name`, waiting (bounded) until someone has preloaded it."""
        import time
        from zmqflow.common.errors import NotFoundError
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.clients[shard].call(PsOps.TakeRows(name), tensors=[np.zeros(0, np.int64)])[0]["rows"]
            except NotFoundError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def take_rows_async(self, name, indices, shard=0):
        pending = self.clients[shard].submit(PsOps.TakeRows(name), tensors=[np.asarray(indices, dtype=np.int64)])
        return _Gathered([pending], lambda replies: dict(zip(replies[0][0]["names"], replies[0][1])))

    # ------------------------------------------------ checkpoints and the end

    def save(self, directory, keep=5, config=None):
        """Every shard writes its pieces, then the checkpoint is committed (atomic, `latest` updated)."""
        from zmqflow.common.checkpoints import checkpoint
        step = self.clients[0].call(PsOps.Stats())[0]["version"]  # the global step lives on ps 0
        self._on_shards(PsOps.Save(str(directory), step, checkpoint.file_metadata(config)))
        return checkpoint.commit(str(directory), step, len(self.clients), config or {}, keep=keep)

    def stats(self):
        return self._on_shards(PsOps.Stats(), timeout=5.0)

    def join(self, replica, attempts=3):
        """Make `replica` a member of the sync steps on every shard; returns ps 0's answer: `step`, from which
        its pushes count (the same on every shard: ps 0 picks it, the others admit from it), and whether the
        job is `elastic`. Pull with min_version=step next. A shard already past that step (it completed a whole
        step meanwhile) makes the replica leave every shard again and ask anew, at most `attempts` times."""
        from zmqflow.common.errors import FailedPreconditionError
        for attempt in range(attempts):
            answer = self.clients[0].call(PsOps.Join(replica))[0]
            calls = [c.submit(PsOps.Join(replica, answer["step"])) for c in self.clients[1:]]
            try:
                for call in calls:
                    call.result()
                return answer
            except FailedPreconditionError:
                for call in calls:      # every answer in before the leave, so none admits after it
                    try:
                        call.result()
                    except FailedPreconditionError:
                        pass
                self.worker_done(replica)   # on no shard a member (nor waited for) unless on all
                if attempt == attempts - 1:
                    raise

    def worker_done(self, replica, lost=False):
        """`replica` finished its input; `lost=True` is the chief counting a silent worker as finished."""
        self._on_shards(PsOps.WorkerDone(replica, lost))

    def shutdown(self):
        self._on_shards(PsOps.Shutdown(), timeout=5.0)

    def close(self):
        for c in self.clients:
            c.close()

    # ------------------------------------------------ pieces <-> variables

    def _split(self, values):
        pieces = {}
        for name, value in values.items():
            pieces.update(self.placement.split(name, value))
        return pieces

    def _assemble_pull(self, replies, exclude=frozenset()):
        changed = False
        for i, (result, tensors) in enumerate(replies):
            self.versions[i] = result["version"]
            if "layout" in result:   # a packed answer: one frame holding every piece
                tensors = self._layouts[i].unpack(result["layout"], tensors[0] if len(tensors) == 1 else None)
            names = result.get("names", [])
            if len(names) != len(tensors):
                raise InvalidArgumentError(f"ps:{i} answered a pull with {len(tensors)} tensors for {len(names)} names")
            for key, t in zip(names, tensors):
                self._parts[key] = t.astype(np.float32) if is_bfloat16(t.dtype) else t
                changed = True
        if exclude:
            return {v: self.placement.assemble(v, self._parts) for v in self.placement.variables() if v not in exclude}
        if not changed and self._model is not None:
            return None  # a pull_if_newer that found nothing new
        self._model = {v: self.placement.assemble(v, self._parts) for v in self.placement.variables()}
        return self._model


class _Gathered:
    """Requests to every shard, in flight together; `result()` waits for all."""

    def __init__(self, calls, combine):
        self.calls, self.combine, self.value = calls, combine, None

    def result(self):
        """The combined answers, combined once (a pull's assembly sets the client's versions)."""
        if self.combine is not None:
            self.value, self.combine = self.combine([c.result() for c in self.calls]), None
        return self.value


# ------------------------------------------------ shared variables (TF's variables in resource containers)

SHARED_TIMEOUT_S = 30.0
_NATURAL = {"i": np.dtype(np.int32), "f": np.dtype(np.float32)}
"""TF's dtype of an initial value given as Python numbers: tf.Variable(0) is int32, tf.Variable(0.0) float32."""


class SharedVariables:
    """The shared variables of a job's ps shards (`endpoints`, in task order): `variable(name)` reaches the
    one of that name in the current container on the shard the placement names, whichever client asks."""

    def __init__(self, endpoints, timeout=SHARED_TIMEOUT_S, pool=None):
        self.endpoints = [endpoint_of(e) for e in endpoints]
        if not self.endpoints:
            raise InvalidArgumentError("shared variables need the address of at least one ps task")
        self.timeout, self._pool = timeout, pool or default_pool

    def shard_of(self, name, container=""):
        return shared_variable_shard(container, name, len(self.endpoints))

    def variable(self, name, initial_value=None, dtype=None, container=None):
        """The shared variable `name` of `container` (default: the enclosing `container` scope's).

        With `initial_value` it is created with that value unless it exists, when it is used as it is (TF's
        initializer guarded by is_variable_initialized: two clients may both run it); one of another dtype
        or shape is InvalidArgumentError. Without, it must exist: NotFoundError otherwise."""
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"a shared variable needs a non-empty string name, got {name!r:.60}")
        container = current_container() if container is None else check_container(container)
        address = self.endpoints[self.shard_of(name, container)]
        client = self._pool.get(address)
        if initial_value is None:
            if dtype is not None:
                raise InvalidArgumentError(f"dtype= without initial_value= for shared variable {name!r}: the dtype "
                                           "is the one it was created with")
            answer, _ = client.call(PsOps.ReadVariable(name, container), timeout=self.timeout)
        else:
            value = _initial_value(initial_value, dtype, name)
            answer, _ = client.call(PsOps.CreateVariable(name, container), tensors=[value], timeout=self.timeout)
        return SharedVariable(address, container, name, answer["dtype"], answer["shape"], self._pool, self.timeout)

    def list(self, container=None):
        """Every shared variable of every shard (of `container` when given): container, name, dtype, shape."""
        calls = [self._pool.get(a).submit(PsOps.ListVariables(container), timeout=self.timeout)
                 for a in self.endpoints]
        return sorted((v for c in calls for v in c.result()[0]["variables"]),
                      key=lambda v: (v["container"], v["name"]))

    def reset(self, containers=None):
        """Free every shared variable of `containers` (a name or a list; None: every container that holds one)
        on every shard, as TF's Session.reset; {container: variables freed}. The model's variables are in no
        container and stay. An admin op: the admin token, as the broker's reset."""
        names = sorted({v["container"] for v in self.list()}) if containers is None else containers_of(containers)
        freed = {}
        for container in names:
            calls = [self._pool.get(a).submit(PsOps.Reset(container), timeout=self.timeout) for a in self.endpoints]
            freed[container] = sum(c.result()[0]["freed"] for c in calls)
        return freed


class SharedVariable:
    """One shared variable (TF's tf.Variable in a container, read and changed by any client of the job).
    Each op is one request, atomic on its shard: `assign_add(1)` from two processes adds 2."""

    def __init__(self, address, container, name, dtype, shape, pool=None, timeout=SHARED_TIMEOUT_S):
        self.address, self.container, self.name = address, container, name
        self.dtype, self.shape = _dtype(dtype), tuple(shape)
        self._pool, self.timeout = pool or default_pool, timeout

    def __repr__(self):
        return (f"<SharedVariable {self.name!r} container={self.container!r} shape={self.shape} "
                f"dtype={name_of_or_str(self.dtype)} on {self.address}>")

    def read_value(self):
        """The current value (a numpy array; a 0-d one for a scalar)."""
        return self._call(PsOps.ReadVariable(self.name, self.container))

    read = read_value

    def assign(self, value, read_value=True):
        """Set the value (the variable's dtype and shape); the new value, or None without `read_value`."""
        return self._call(PsOps.AssignVariable(self.name, self.container, read_value),
                          [self._value(value, "assign")])

    def assign_add(self, delta, read_value=True):
        """Add `delta` (the variable's dtype and shape) atomically; the sum, or None without `read_value`."""
        return self._call(PsOps.AssignAddVariable(self.name, self.container, read_value),
                          [self._value(delta, "assign_add")])

    def scatter_add(self, sparse_delta, updates=None, read_value=True):
        """Add rows: `scatter_add(IndexedSlices(indices, values))` as TF's Variable.scatter_add, or
        `scatter_add(indices, updates)` as tf.scatter_add; rows named twice get both. The new value, or None."""
        if isinstance(sparse_delta, IndexedSlices):
            if updates is not None:
                raise InvalidArgumentError("scatter_add takes IndexedSlices or (indices, updates), not both")
            indices, updates = sparse_delta.indices, sparse_delta.values
        else:
            indices = sparse_delta
        if updates is None:
            raise InvalidArgumentError("scatter_add needs the rows to add: (indices, updates) or IndexedSlices")
        indices = np.asarray(indices)
        if indices.dtype.kind not in "iu":
            raise InvalidArgumentError(f"scatter_add of {self.name!r}: indices must be integers, got "
                                       f"{name_of_or_str(indices.dtype)}")
        return self._call(PsOps.ScatterAddVariable(self.name, self.container, read_value),
                          [indices.astype(np.int64, copy=False), self._value(updates, "scatter_add", shape=False)])

    def _value(self, value, op, shape=True):
        array = _converted(value, self.dtype, f"{op} of shared variable {self.name!r}")
        if shape and array.shape != self.shape:
            raise InvalidArgumentError(f"{op} of shared variable {self.name!r}: expected shape {list(self.shape)}, "
                                       f"got {list(array.shape)}")
        return array

    def _call(self, request, tensors=()):
        answer, values = self._pool.get(self.address).call(request, tensors=tensors, timeout=self.timeout)
        return values[0] if values else None


def _initial_value(value, dtype, name):
    """The initial value as an array: `dtype` when given, else a numpy value's own, else TF's for Python
    numbers (int32, float32, bool)."""
    what = f"initial value of shared variable {name!r}"
    if dtype is not None:
        return _converted(value, _dtype(dtype), what)
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    try:
        natural = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what}: {value!r:.60} is no array ({exc})") from None
    return _converted(value, _NATURAL.get(natural.dtype.kind, natural.dtype), what)


def _dtype(dtype):
    """A numpy dtype from a wire name ("int32"), a numpy dtype or type; InvalidArgumentError for another."""
    try:
        return as_numpy(dtype if isinstance(dtype, str) else name_of_or_str(np.dtype(dtype)))
    except TypeError:
        raise InvalidArgumentError(f"dtype {dtype!r:.60} is no dtype; use a name such as 'float32'") from None


def _converted(value, dtype, what):
    """`value` as an array of `dtype`: Python numbers converted as TF converts them (never losing a fraction
    or overflowing), a numpy array of another dtype refused (no silent casts)."""
    name = name_of_or_str(dtype)
    try:
        array = to_array(value, name)
        natural = None if isinstance(value, (np.ndarray, np.generic)) else np.asarray(value)
    except (KeyError, OverflowError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what}: {value!r:.60} is no {name} value ({exc})") from None
    except InvalidArgumentError as exc:
        raise InvalidArgumentError(f"{what}: {exc}") from None
    if natural is not None and natural.dtype.kind in "fc" and array.dtype.kind in "iub" \
            and not np.array_equal(array, natural):
        raise InvalidArgumentError(f"{what}: {value!r:.60} is no {name} value (it has a fraction)")
    return array
