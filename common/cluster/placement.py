"""Variable placement over ps tasks: which shard holds which variable, or which rows of one.

Every task computes the placement from the same ordered variable list, so ps shards,
workers and the chief agree without talking to each other. Strategies, as in
TensorFlow's `replica_device_setter`:

- `round_robin` (its default ps_strategy): the i-th piece in list order goes to ps
  task i % num_ps.
- `greedy` (GreedyLoadBalancingStrategy with byte_size_load_fn): each piece, in list
  order, goes to the ps holding the fewest bytes so far; ties go to the lowest index.

Partitioning (like `tf.fixed_size_partitioner` / `min_max_variable_partitioner`): with
`max_shard_bytes` set, a variable of more bytes than that is split along axis 0 into
ceil(bytes / max_shard_bytes) contiguous row blocks (at most one block per row); the
first `rows % num_parts` blocks get one extra row, as TF slices a PartitionedVariable.
Block i is the piece `<variable>/part_<i>` and is placed by the strategy as a piece of
its own, the way TF places the parts of a partitioned variable: with round_robin the
blocks of one variable land on consecutive shards, with greedy each block goes to the
lightest shard at its turn. Scalars and one-row variables are never split.

Shared variables (a client's `session.variable(name)` in a container, not the model's) are placed by
name, not by list order: clients create them in any order, so `shared_variable_shard` hashes
(container, name) (CRC-32, the same in every process and Python) onto one ps task, which every client
and a restored shard compute alike.
"""

import dataclasses
import zlib

import numpy as np

from zmqflow.common.wire.dtypes import as_numpy
from zmqflow.common.errors import InvalidArgumentError, NotFoundError, check_int

STRATEGIES = ("round_robin", "greedy")


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows [row_start, row_end) of `variable` (block `part` of `num_parts`), held by ps `shard`.

    `shape` is the piece's own shape. A scalar variable is one piece with rows [0, 1).
    """

    variable: str
    part: int
    num_parts: int
    row_start: int
    row_end: int
    shape: tuple
    dtype: str
    shard: int

    @property
    def key(self):
        """The name the piece travels and is stored under: the variable's, or `<variable>/part_<i>`."""
        return self.variable if self.num_parts == 1 else f"{self.variable}/part_{self.part}"

    @property
    def nbytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * as_numpy(self.dtype).itemsize


class Placement:
    """The ordered pieces of every variable and the shard of each; built by `place`."""

    def __init__(self, pieces, num_shards, strategy, max_shard_bytes=None):
        self.pieces = tuple(pieces)
        self.num_shards = num_shards
        self.strategy = strategy
        self.max_shard_bytes = max_shard_bytes
        self._by_variable = {}
        for piece in self.pieces:
            self._by_variable.setdefault(piece.variable, []).append(piece)
        # each variable's (key, shape) of its pieces, for `assemble`: it runs for every variable of every pull
        self._blocks = {v: tuple((p.key, p.shape) for p in pieces) for v, pieces in self._by_variable.items()}

    def __iter__(self):
        return iter(self.pieces)

    def __len__(self):
        return len(self.pieces)

    def __eq__(self, other):
        return isinstance(other, Placement) and (self.pieces, self.num_shards) == (other.pieces, other.num_shards)

    def variables(self):
        """The variable names, in list order."""
        return list(self._by_variable)

    def for_shard(self, shard):
        """The pieces ps task `shard` holds, in placement order."""
        if not 0 <= shard < self.num_shards:
            raise InvalidArgumentError(f"shard {shard} is not in [0, {self.num_shards})")
        return [p for p in self.pieces if p.shard == shard]

    def pieces_of(self, variable):
        """The row blocks of `variable`, in row order."""
        if variable not in self._by_variable:
            raise NotFoundError(f"variable {variable!r} is not in the placement")
        return list(self._by_variable[variable])

    def shape_of(self, variable):
        """The whole variable's shape."""
        pieces = self.pieces_of(variable)
        if len(pieces) == 1:
            return pieces[0].shape
        return (pieces[-1].row_end,) + pieces[0].shape[1:]

    def shard_bytes(self):
        """Bytes held by each shard, indexed by shard."""
        loads = [0] * self.num_shards
        for piece in self.pieces:
            loads[piece.shard] += piece.nbytes
        return loads

    def as_rows(self):
        """One JSON-ready dict per piece, in placement order."""
        return [{"variable": p.variable, "key": p.key, "part": p.part, "num_parts": p.num_parts,
                 "row_start": p.row_start, "row_end": p.row_end, "shape": list(p.shape), "dtype": p.dtype,
                 "bytes": p.nbytes, "shard": p.shard} for p in self.pieces]

    def table(self):
        """An aligned text table of the pieces, then the load of each shard: printed at start-up."""
        head = ("variable", "part", "rows", "shape", "dtype", "bytes", "shard")
        rows = [head] + [(p.variable, "-" if p.num_parts == 1 else f"{p.part}/{p.num_parts}",
                          f"{p.row_start}:{p.row_end}", "x".join(map(str, p.shape)) or "scalar", p.dtype,
                          str(p.nbytes), f"ps:{p.shard}") for p in self.pieces]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        right = {"bytes"}
        lines = ["  ".join(c.rjust(w) if h in right else c.ljust(w) for c, w, h in zip(r, widths, head)).rstrip()
                 for r in rows]
        for shard, nbytes in enumerate(self.shard_bytes()):
            count = sum(p.shard == shard for p in self.pieces)
            lines.append(f"ps:{shard} holds {count} piece{'s' * (count != 1)}, {nbytes} bytes")
        return "\n".join(lines)

    def assemble(self, variable, parts):
        """The whole variable from {key: block}; one block is returned as it is (no copy)."""
        blocks = self._blocks.get(variable) or self.pieces_of(variable)   # pieces_of: NotFoundError
        arrays = []
        for key, shape in blocks:
            if key not in parts:
                raise InvalidArgumentError(f"piece {key!r} of variable {variable!r} is missing")
            block = np.asarray(parts[key])
            if block.shape != shape:
                raise InvalidArgumentError(f"piece {key!r} has shape {list(block.shape)}, expected {list(shape)}")
            arrays.append(block)
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    def split(self, variable, value):
        """{key: block} of a whole value (a gradient); blocks are views of `value`, not copies."""
        pieces = self.pieces_of(variable)
        value = np.asarray(value)
        if value.shape != self.shape_of(variable):
            raise InvalidArgumentError(f"value of shape {list(value.shape)} does not match variable {variable!r} "
                                       f"of shape {list(self.shape_of(variable))}")
        if len(pieces) == 1:
            return {pieces[0].key: value}
        return {p.key: value[p.row_start:p.row_end] for p in pieces}


def place(variables, num_ps, strategy="round_robin", max_shard_bytes=None):
    """The placement of `variables` (VariableSpec list, in order) over `num_ps` ps tasks."""
    _check_arguments(variables, num_ps, strategy, max_shard_bytes)
    loads = [0] * num_ps
    pieces = []
    for var in variables:
        blocks = row_blocks(var, max_shard_bytes)
        for part, (start, end) in enumerate(blocks):
            shard = len(pieces) % num_ps if strategy == "round_robin" else loads.index(min(loads))
            shape = tuple(var.shape) if len(blocks) == 1 else (end - start,) + tuple(var.shape[1:])
            piece = Piece(var.name, part, len(blocks), start, end, shape, var.dtype, shard)
            loads[shard] += piece.nbytes
            pieces.append(piece)
    keys = set()
    for piece in pieces:
        if piece.key in keys:
            raise InvalidArgumentError(f"piece name {piece.key!r} is used twice (a variable is named like a part)")
        keys.add(piece.key)
    return Placement(pieces, num_ps, strategy, max_shard_bytes)


def shared_variable_shard(container, name, num_ps):
    """The ps task that holds shared variable `name` of `container`: CRC-32 of both, modulo `num_ps`."""
    check_int("num_ps", num_ps, 1)
    return zlib.crc32(f"{container}\0{name}".encode("utf-8", "surrogatepass")) % num_ps


def row_blocks(var, max_shard_bytes=None):
    """[(row_start, row_end), ...] of a variable: one block unless it is larger than max_shard_bytes."""
    rows = int(var.shape[0]) if var.shape else 1
    nbytes = var.size * as_numpy(var.dtype).itemsize
    if max_shard_bytes is None or nbytes <= max_shard_bytes or not var.shape or rows < 2:
        return [(0, rows)]
    num_parts = min(rows, -(-nbytes // max_shard_bytes))
    base, extra = divmod(rows, num_parts)
    blocks, start = [], 0
    for i in range(num_parts):
        end = start + base + (i < extra)
        blocks.append((start, end))
        start = end
    return blocks


def _check_arguments(variables, num_ps, strategy, max_shard_bytes):
    check_int("num_ps", num_ps, 1)
    if strategy not in STRATEGIES:
        raise InvalidArgumentError(f"placement strategy {strategy!r} is not known; expected one of "
                                   f"{', '.join(STRATEGIES)}")
    check_int("max_shard_bytes", max_shard_bytes, 1, optional=True)
    seen = set()
    for var in variables:
        if var.name in seen:
            raise InvalidArgumentError(f"variable {var.name!r} appears twice in the variable list")
        seen.add(var.name)
