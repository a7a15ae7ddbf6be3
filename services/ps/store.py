"""The variables of one ps shard: its pieces, their optimizer slots and the gradient scratch in one
layout, the version (global step as this shard sees it), and the snapshots pulls are answered from.
Plain numpy, no sockets, no update rule: rules.py decides what a push does, this module how the
arithmetic runs over the buffers. Not thread-safe (the service loop is single-threaded).

Pulls return read-only snapshots: one fresh contiguous buffer with a view per piece, so the server
can send it zero-copy while later pushes update the live values. Full pulls of an unchanged state
share one snapshot (sync workers all pull the same step).

`SharedVariables` holds the other kind: variables any client of the job creates by name in a container
(TF's resource containers), outside the model, never touched by the optimizer.
"""

import sys
from collections.abc import Mapping

import numpy as np

from zmqflow.common.wire.dtypes import DTYPE_NAMES, STRING, as_numpy, name_of_or_str
from zmqflow.common.errors import (AlreadyExistsError, FailedPreconditionError, InvalidArgumentError, NotFoundError,
                                   ResourceExhaustedError, check_int)
from zmqflow.common.optimizers import Optimizer, make_optimizer

_ALIGN = 64  # bytes between pieces in a snapshot buffer, so every view is aligned
DIRECT_APPLY_BYTES = 4 * 1024 * 1024  # above this, a push is applied without the copy into the flat layout


class VariableStore:
    def __init__(self, pieces, optimizer):
        self.specs = _check_pieces(pieces)
        self.optimizer = optimizer if isinstance(optimizer, Optimizer) else make_optimizer(optimizer)
        self._offsets, nbytes = _layout(self.specs)
        self._buffer = np.zeros(nbytes, np.uint8)  # all values, contiguous: a full pull is one memcpy
        self._values = _views(self._buffer, self.specs, self._offsets)
        # Slots and gradient scratch share the values' layout. With one dtype for every piece, a
        # dense update is then ONE optimizer call over the flat buffers (padding has zero
        # gradients and stays zero) instead of a kernel dispatch per piece: 4 calls of the
        # MNIST MLP's Adam took 533 us per push on the ps, one call takes about half.
        dtypes = {dtype for _, dtype in self.specs.values()}
        self._flat_dtype = dtypes.pop() if len(dtypes) == 1 else None
        if self._flat_dtype:
            self._flat_slots = {spec.name: np.full(nbytes // self._flat_dtype.itemsize, spec.initial_value,
                                                   self._flat_dtype) for spec in self.optimizer.slot_specs((1,))}
            self._slots = {name: {n: _views(b.view(np.uint8), {name: self.specs[name]}, self._offsets)[name]
                                  for n, b in self._flat_slots.items()} for name in self.specs}
        else:
            self._slots = {name: self.optimizer.create_slots(v) for name, v in self._values.items()}
        self._grad_buffer = np.zeros(nbytes, np.uint8)  # dense gradients (sync: their sum) in the layout
        self._scratch = _views(self._grad_buffer, self.specs, self._offsets)
        self._snapshots = SnapshotPool(nbytes)
        self._warm_up()
        self._summed = dict.fromkeys(self.specs, 0)       # dense gradients summed in the scratch (sync)
        self._rows = {name: [] for name in self.specs}    # (indices, rows) copies awaiting the mean (sync)
        self.on_load = lambda: None  # the rule's: a load (initialize, restore) starts a sync step afresh

        self.initialized = False
        self.version = 0
        self._generation = 0  # bumped on every change of the values: keys the shared snapshot
        self._snapshot = None
        self.pulls = self.bytes_pulled = 0

    def _warm_up(self):
        """Compile (or load from numba's cache) the update kernel now, not during the first push:
        it took 0.38 s there, inside the training time."""
        self.optimizer.warm_up(dtype for _, dtype in self.specs.values())

    # ------------------------------------------------------------------ set-up

    def initialize(self, values, step=0, force=False):
        """The chief's initial values. Once only: a repeated identical call (a retried request)
        is a no-op, a different one is AlreadyExists unless `force`."""
        _check_arrays(values, self.specs, "initial values")
        check_int("step", step)
        if self.initialized and not force:
            if step == self.version and all(np.array_equal(values[n], v) for n, v in self._values.items()):
                return
            raise AlreadyExistsError(f"variables of ps shard already initialized (version {self.version}); "
                                     "initialize with force=True to overwrite them")
        self._load(values, None, step)

    def restore(self, values, slots, step):
        """Values and optimizer slots from a checkpoint (`slots` None: fresh slots)."""
        _check_arrays(values, self.specs, "restored values")
        check_int("step", step)
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
        self.clear_sum()
        self.on_load()
        self.version, self.initialized = int(step), True
        self._generation += 1

    # ------------------------------------------------------------------ reads

    @property
    def generation(self):
        """Bumped on every change of the values (and version): one generation, one snapshot, so an answer
        built from a full pull can be kept until it moves."""
        return self._generation

    def pull(self, names=None, newer_than=None):
        """(version, {name: read-only array}) of a snapshot; (version, None) when `newer_than`
        is given and the shard has nothing newer."""
        self.require_initialized()
        if newer_than is not None and self.version <= newer_than:
            return self.version, None
        if names is None:
            if self._snapshot is None or self._snapshot[0] != self._generation:
                views = self._fresh_snapshot()
                self._snapshot = (self._generation, views, sum(v.nbytes for v in views.values()))
            _, views, nbytes = self._snapshot
            values = dict(views)
        else:
            specs = {name: self.specs[self.spec_name(name)] for name in names}
            offsets, nbytes = _layout(specs)
            values = _views(np.zeros(nbytes, np.uint8), specs, offsets)   # zero padding: sent packed
            for name, view in values.items():
                np.copyto(view, self._values[name])
                view.flags.writeable = False
            nbytes = sum(v.nbytes for v in values.values())
        self.pulls += 1
        self.bytes_pulled += nbytes
        return self.version, values

    def _fresh_snapshot(self):
        """Read-only views into a copy of the values (a pooled buffer when one is free)."""
        buffer = self._snapshots.take()
        np.copyto(buffer, self._buffer)
        return {name: _read_only(view) for name, view in _views(buffer, self.specs, self._offsets).items()}

    def pull_rows(self, name, indices):
        """A fresh copy of rows `indices` (local to the piece) of piece `name`."""
        self.require_initialized()
        var = self._values[self.spec_name(name)]
        rows = var[_check_indices(indices, var.shape, name)]
        self.pulls += 1
        self.bytes_pulled += rows.nbytes
        return rows

    def snapshot_for_checkpoint(self):
        """(step, {name: value}, {name: {slot: value}}), all copies."""
        self.require_initialized()
        values = {name: v.copy() for name, v in self._values.items()}
        slots = {name: {s: a.copy() for s, a in slots.items()} for name, slots in self._slots.items()}
        return self.version, values, slots

    # ------------------------------------------------------------------ writes

    def assign(self, values):
        """New values of some pieces, set as they are: the non-trainable variables a model
        computes (BatchNorm's moving statistics), never given to the optimizer. The version
        does not move; the last writer wins, as TensorFlow's assign on a ps variable."""
        self.require_initialized()
        unknown = sorted(set(values) - set(self.specs))
        if unknown:
            raise InvalidArgumentError(f"assign names pieces this shard does not hold: {unknown}")
        _check_arrays(values, {n: self.specs[n] for n in values}, "assigned values")
        for name, value in values.items():
            np.copyto(self._values[name], value)
        self._generation += 1          # pulls see the new values
        return len(values)

    def apply(self, grads, sparse, scale=None):
        """One optimizer update with dense `grads` and `sparse` rows ({name: (indices, rows)}), each
        times `scale` when given (an np.float64); then the version grows by one."""
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
        else:
            for name, grad in grads.items():
                view = self._scratch[name]
                np.copyto(view, grad)
                if scale is not None:
                    np.multiply(view, scale.astype(view.dtype), out=view)
            self._apply_flat()
        self._advance()

    def add(self, grads, sparse):
        """Add a contribution to the sum awaiting `apply_mean`: dense gradients into the scratch,
        sparse rows kept as copies (the frames they came in are let go)."""
        for name, grad in grads.items():
            acc = self._scratch[name]
            if self._summed[name]:
                np.add(acc, grad, out=acc)
            else:
                np.copyto(acc, grad)
            self._summed[name] += 1
        for name, (indices, rows) in sparse.items():
            self._rows[name].append((indices.copy(), rows.copy()))

    def apply_mean(self, counts):
        """One update of each piece with the mean of the sum `add` built, `counts[name]` contributions
        to that piece (none: the piece is left alone); then the sum is cleared and the version grows."""
        distinct = set(counts.values())
        if self._flat_dtype is not None and not any(self._rows.values()) and len(distinct) == 1 and 0 not in distinct:
            flat = self._grad_buffer.view(self._flat_dtype)  # dense only: average and apply in one call
            np.divide(flat, self._flat_dtype.type(distinct.pop()), out=flat)
            self._apply_flat()
        else:
            for name, var in self._values.items():
                self._apply_piece_mean(name, var, counts[name])
        self.clear_sum()
        self._advance()

    def _apply_piece_mean(self, name, var, count):
        if not count:
            return
        acc, rows = self._scratch[name], self._rows[name]
        if self._summed[name]:
            for indices, values in rows:
                np.add.at(acc, indices, values)
            np.divide(acc, var.dtype.type(count), out=acc)
            self.optimizer.apply_dense(var, acc, self._slots[name], self.version)
        else:
            indices = np.concatenate([i for i, _ in rows])
            values = np.concatenate([r for _, r in rows])
            np.divide(values, var.dtype.type(count), out=values)
            self.optimizer.apply_sparse(var, indices, values, self._slots[name], self.version)

    def clear_sum(self):
        for name in self.specs:
            self._summed[name] = 0
            self._rows[name].clear()

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

    def _advance(self):
        self.version += 1
        self._generation += 1

    # ------------------------------------------------------------------ checks

    def check_gradients(self, grads, sparse):
        """(sparse gradients as {name: (flat indices, rows)}, bytes of the push) after checking every
        dense and sparse piece: names, bounds, shapes and dtypes; together they cover every piece."""
        if not isinstance(sparse, Mapping):
            raise InvalidArgumentError(f"sparse gradients must map piece names to (indices, rows), got "
                                       f"{type(sparse).__name__}")
        checked = {}
        for name, pair in sparse.items():
            name = self.spec_name(name)
            try:
                indices, rows = pair
            except (TypeError, ValueError):
                raise InvalidArgumentError(f"sparse gradient of {name!r} must be (indices, rows)") from None
            checked[name] = self.checked_rows(name, indices, rows)
        nbytes = _check_arrays(grads, {n: s for n, s in self.specs.items() if n not in checked}, "gradients")
        return checked, nbytes + sum(i.nbytes + r.nbytes for i, r in checked.values())

    def checked_rows(self, name, indices, rows):
        """(indices as a flat int array, rows) of a sparse gradient of piece `name`, checked."""
        var = self._values[name]
        indices = _check_indices(indices, var.shape, name).reshape(-1)
        if not isinstance(rows, np.ndarray) or rows.dtype != var.dtype or rows.shape != indices.shape + var.shape[1:]:
            raise InvalidArgumentError(
                f"sparse gradient of {name!r} must be {var.dtype} rows of shape "
                f"{list(indices.shape + var.shape[1:])}, got {getattr(rows, 'dtype', type(rows).__name__)} "
                f"{list(np.shape(rows))}")
        return indices, rows

    def require_initialized(self):
        if not self.initialized:
            raise FailedPreconditionError("variables of ps shard not initialized; the chief initializes them")

    def spec_name(self, name):
        if name not in self.specs:
            raise NotFoundError(f"ps shard has no variable {name!r}; it holds {', '.join(self.specs) or 'none'}")
        return name

    def config(self):
        return {"optimizer": self.optimizer.get_config(),
                "pieces": {n: {"shape": list(s), "dtype": d.name} for n, (s, d) in self.specs.items()}}


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


def is_int(value, minimum):
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


# ---------------------------------------------------------------------- shared variables

SHARED_DTYPE_NAMES = frozenset(name for name in DTYPE_NAMES if name != STRING)
"""The dtypes a shared variable may hold, by name: a set of dtypes would import ml_dtypes for bfloat16's."""
VARIABLE_OVERHEAD_BYTES = 256
"""What one shared variable counts against the shard's budget besides its values: an empty one is no free
resource (a loop creating millions of them would otherwise hold the shard's memory outside any bound)."""


def shared_name(container, name):
    """How errors name a shared variable: `'counter' in container 'counters'` (or the default container)."""
    return f"{name!r} in " + (f"container {container!r}" if container else "the default container")


class SharedVariables:
    """Shared variables of one ps shard: {(container, name): array}, created once, changed in place by
    assign, assign_add and scatter_add (each atomic: the service loop is single-threaded), freed by
    container. Every value is checked against the variable (dtype, shape, index ranges); what the shard
    holds stays below `max_bytes` (values plus VARIABLE_OVERHEAD_BYTES each)."""

    def __init__(self, max_bytes):
        self.max_bytes = check_int("max_bytes", max_bytes)
        self._values = {}
        self.nbytes = 0

    def __len__(self):
        return len(self._values)

    def create(self, container, name, value):
        """True when created; False when it exists with the same dtype and shape (its value stays)."""
        value = _shared_value(value, container, name)
        held = self._values.get((container, name))
        if held is not None:
            if (held.dtype, held.shape) != (value.dtype, value.shape):
                raise InvalidArgumentError(f"shared variable {shared_name(container, name)} exists as "
                                           f"{_described(held)}; it cannot be created again as {_described(value)}")
            return False
        self._charge({(container, name): value})
        self._values[(container, name)] = value.copy()   # its own writable memory, not the request's frame
        return True

    def read(self, container, name):
        """A copy of the value (the reply is sent zero-copy while later ops change the variable)."""
        return self._get(container, name).copy()

    def assign(self, container, name, value):
        var = self._get(container, name)
        np.copyto(var, self._same_as(var, value, "assign", container, name))
        return var

    def assign_add(self, container, name, delta):
        var = self._get(container, name)
        np.add(var, self._same_as(self._numeric(var, "assign_add", container, name), delta, "assign_add",
                                  container, name), out=var)
        return var

    def scatter_add(self, container, name, indices, updates):
        """updates[i] added to row indices[i]; rows named twice get both."""
        var = self._numeric(self._get(container, name), "scatter_add", container, name)
        what = f"scatter_add of shared variable {shared_name(container, name)}"
        if not var.shape:
            raise InvalidArgumentError(f"{what}: the variable is a scalar; scatter_add adds rows of a variable "
                                       "of rank 1 or more")
        if not isinstance(indices, np.ndarray) or indices.dtype.kind not in "iu":
            raise InvalidArgumentError(f"{what}: indices must be int32 or int64, got "
                                       f"{name_of_or_str(getattr(indices, 'dtype', None))}")
        bad = indices[(indices < 0) | (indices >= var.shape[0])] if indices.size else indices
        if bad.size:
            raise InvalidArgumentError(f"{what}: indices[...] = {int(bad.reshape(-1)[0])} is not in "
                                       f"[0, {var.shape[0]})")
        expected = indices.shape + var.shape[1:]
        if not isinstance(updates, np.ndarray) or updates.dtype != var.dtype or updates.shape != expected:
            raise InvalidArgumentError(f"{what}: updates must be {name_of_or_str(var.dtype)} {list(expected)} "
                                       f"(the indices' shape, then the variable's row shape), got "
                                       f"{_described(updates)}")
        np.add.at(var, indices, updates)
        return var

    def reset(self, container):
        """Free every variable of `container`; how many there were."""
        freed = [key for key in self._values if key[0] == container]
        for key in freed:
            self.nbytes -= _cost(key, self._values.pop(key))
        return len(freed)

    def list(self, container=None):
        return [{"container": c, "name": n, "dtype": name_of_or_str(v.dtype), "shape": list(v.shape)}
                for (c, n), v in sorted(self._values.items()) if container is None or c == container]

    def snapshot(self):
        """{(container, name): copy of the value}: what a checkpoint keeps."""
        return {key: value.copy() for key, value in self._values.items()}

    def replace(self, values):
        """Hold exactly `values` ({(container, name): array}, a checkpoint's), each checked as at create."""
        checked = {key: _shared_value(value, *key).copy() for key, value in values.items()}
        old, self._values, self.nbytes = self._values, {}, 0
        try:
            self._charge(checked)
        except ResourceExhaustedError:
            self._values, self.nbytes = old, sum(_cost(k, v) for k, v in old.items())
            raise
        self._values = checked

    # ------------------------------------------------------------------ checks

    def _get(self, container, name):
        var = self._values.get((container, name))
        if var is None:
            held = sorted(n for c, n in self._values if c == container)
            raise NotFoundError(f"no shared variable {shared_name(container, name)} on this ps (it holds "
                                f"{', '.join(map(repr, held[:10])) or 'none'} there): create it first, with an "
                                "initial value; a reset of its container frees it")
        return var

    def _charge(self, values):
        cost = sum(_cost(key, value) for key, value in values.items())
        if self.nbytes + cost > self.max_bytes:
            container, name = next(iter(values), ("", ""))
            raise ResourceExhaustedError(f"shared variable {shared_name(container, name)} of {cost} bytes: the ps "
                                         f"holds {self.nbytes} and holds at most {self.max_bytes} bytes of shared "
                                         "variables in all (--max-shared-variable-bytes)")
        self.nbytes += cost

    @staticmethod
    def _same_as(var, value, op, container, name):
        if not isinstance(value, np.ndarray) or value.dtype != var.dtype or value.shape != var.shape:
            raise InvalidArgumentError(f"{op} of shared variable {shared_name(container, name)}: expected "
                                       f"{_described(var)}, got {_described(value)}")
        return value

    @staticmethod
    def _numeric(var, op, container, name):
        if var.dtype == np.bool_:
            raise InvalidArgumentError(f"{op} adds numbers; shared variable {shared_name(container, name)} is bool")
        return var


def _shared_value(value, container, name):
    if not isinstance(value, np.ndarray) or name_of_or_str(value.dtype) not in SHARED_DTYPE_NAMES:
        raise InvalidArgumentError(f"shared variable {shared_name(container, name)}: a value of a numeric dtype "
                                   f"({', '.join(n for n in DTYPE_NAMES if n != STRING)}), got {_described(value)}")
    return value


def _described(value):
    """'int64 [2, 3]': a value's dtype and shape, as errors name them."""
    return (f"{name_of_or_str(getattr(value, 'dtype', None)) if hasattr(value, 'dtype') else type(value).__name__} "
            f"{list(np.shape(value)) if isinstance(value, np.ndarray) else ''}").strip()


def _cost(key, value):
    return value.nbytes + VARIABLE_OVERHEAD_BYTES + len(key[0]) + len(key[1])
