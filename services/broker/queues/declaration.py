"""What a client declares when it opens a queue, and the rules for attaching to one.

A declaration arrives from the network as a plain dict, so `from_dict` and
`validate` check every field's type as well as its meaning: anything wrong is
InvalidArgument, never a TypeError escaping into the service loop.
`check_compatible` decides whether a declaration may attach to an existing
queue of the same (container, shared_name), in TensorFlow's order of checks.
"""

from dataclasses import dataclass, fields

from zmqflow.common.wire import dtypes as wire_dtypes
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.wire.limits import DEFAULT_LIMITS

KINDS = ("FIFOQueue", "RandomShuffleQueue", "PaddingFIFOQueue")
MAX_ELEMENT_VALUES = 2 ** 48  # product of one component's known dims; numpy's own limit is near 2**60 bytes
_INT64 = (-2 ** 63, 2 ** 63)


def _is_int(x):
    return type(x) is int  # bool and floats are refused; msgpack ints arrive as int


def format_shape(shape):
    """TF's spelling of a shape: [2,?,3] (None dims are '?'); None is 'unspecified'."""
    if shape is None:
        return "<unknown>"
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _format_shapes(shapes):
    return "unspecified" if shapes is None else ", ".join(format_shape(s) for s in shapes)


@dataclass
class QueueDeclaration:
    """A queue's kind, capacity, components and identity, as the client declared them."""

    kind: str
    capacity: int
    dtypes: list
    shapes: list = None
    names: list = None
    shared_name: str = ""
    container: str = ""
    min_after_dequeue: int = 0
    seed: int = None

    # ------------------------------------------------ wire

    @classmethod
    def from_dict(cls, d):
        """Build from a wire dict (unknown or missing fields are InvalidArgument) and validate."""
        if not isinstance(d, dict):
            raise InvalidArgumentError(f"a queue declaration must be a map, got {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = [k for k in d if k not in known]
        if unknown:
            raise InvalidArgumentError(f"unknown queue declaration fields: {', '.join(map(repr, unknown))[:200]}")
        missing = [k for k in ("kind", "capacity", "dtypes") if k not in d]
        if missing:
            raise InvalidArgumentError(f"queue declaration lacks {', '.join(missing)}")
        values = dict(d)
        for key in ("shared_name", "container"):  # the client sends None for 'not given'
            if values.get(key, "") is None:
                values[key] = ""
        if values.get("min_after_dequeue", 0) is None:
            values["min_after_dequeue"] = 0
        decl = cls(**values)
        decl.validate()
        decl.dtypes = list(decl.dtypes)
        if decl.shapes is not None:
            decl.shapes = [list(s) for s in decl.shapes]
        if decl.names is not None:
            decl.names = list(decl.names)
        return decl

    def to_dict(self):
        return {
            "kind": self.kind, "capacity": self.capacity, "dtypes": list(self.dtypes),
            "shapes": None if self.shapes is None else [list(s) for s in self.shapes],
            "names": None if self.names is None else list(self.names),
            "shared_name": self.shared_name, "container": self.container,
            "min_after_dequeue": self.min_after_dequeue, "seed": self.seed,
        }

    # ------------------------------------------------ validity (§1)

    def validate(self):
        """Raise InvalidArgument unless this declaration could create a queue."""
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"unknown queue kind {self.kind!r:.60}; expected one of {', '.join(KINDS)}")
        if not _is_int(self.capacity):
            raise InvalidArgumentError(f"capacity must be an int, got {self.capacity!r:.60}")
        for key in ("shared_name", "container"):
            if not isinstance(getattr(self, key), str):
                raise InvalidArgumentError(f"{key} must be a string, got {getattr(self, key)!r:.60}")
        self._validate_dtypes()
        self._validate_shapes()
        self._validate_names()
        self._validate_shuffle()

    def _validate_dtypes(self):
        if not isinstance(self.dtypes, (list, tuple)) or not self.dtypes:
            raise InvalidArgumentError(f"dtypes must be a non-empty list of dtype names, got {self.dtypes!r:.60}")
        for name in self.dtypes:
            wire_dtypes.check_name(name)

    def _validate_shapes(self):
        shapes, padding = self.shapes, self.kind == "PaddingFIFOQueue"
        if shapes is None:
            if padding:
                raise InvalidArgumentError("PaddingFIFOQueue requires a shape of known rank for every component")
            return
        if not isinstance(shapes, (list, tuple)):
            raise InvalidArgumentError(f"shapes must be null or a list of shapes, got {shapes!r:.60}")
        if len(shapes) != len(self.dtypes):
            raise InvalidArgumentError(f"shapes has {len(shapes)} entries but dtypes has {len(self.dtypes)}: "
                                       "they must have the same length")
        for i, shape in enumerate(shapes):
            if shape is None and padding:
                raise InvalidArgumentError(f"PaddingFIFOQueue: shape of component {i} has unknown rank; "
                                           "every component needs a shape of known rank")
            if not isinstance(shape, (list, tuple)) and shape is not None:
                raise InvalidArgumentError(f"shape of component {i} must be a list of dims, got {shape!r:.60}")
            if shape is not None and len(shape) > DEFAULT_LIMITS.max_rank:
                raise InvalidArgumentError(f"shape of component {i} has rank {len(shape)} > {DEFAULT_LIMITS.max_rank}")
            values = 1
            for d in shape or ():
                if d is not None and (not _is_int(d) or d < 0):
                    raise InvalidArgumentError(f"shape of component {i} has a bad dimension {d!r:.30}: "
                                               "dims are ints >= 0 or null")
                values *= max(d or 1, 1)
            if values > MAX_ELEMENT_VALUES:
                raise InvalidArgumentError(f"shape {format_shape(shape)} of component {i} is too large")
            if not padding and (shape is None or None in shape):
                raise InvalidArgumentError(f"{self.kind}: all shapes must be fully defined, component {i} has shape "
                                           f"{format_shape(shape)} (use PaddingFIFOQueue for unknown dims)")

    def _validate_names(self):
        names = self.names
        if names is None:
            return
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise InvalidArgumentError(f"names must be null or a list of strings, got {names!r:.60}")
        if len(names) != len(self.dtypes):
            raise InvalidArgumentError(f"names has {len(names)} entries but dtypes has {len(self.dtypes)}")
        if len(set(names)) != len(names):
            raise InvalidArgumentError(f"names must be unique, got {list(names)!r:.100}")

    def _validate_shuffle(self):
        m, seed = self.min_after_dequeue, self.seed
        if not _is_int(m):
            raise InvalidArgumentError(f"min_after_dequeue must be an int, got {m!r:.60}")
        if seed is not None and not (_is_int(seed) and _INT64[0] <= seed < _INT64[1]):
            raise InvalidArgumentError(f"seed must be null or a 64-bit int, got {seed!r:.60}")
        if self.kind != "RandomShuffleQueue":
            if m != 0 or seed is not None:
                raise InvalidArgumentError(f"min_after_dequeue and seed apply to RandomShuffleQueue, not {self.kind}")
            return
        if m < 0:
            raise InvalidArgumentError(f"min_after_dequeue {m} must be >= 0")
        if self.capacity >= 0 and m >= self.capacity:
            raise InvalidArgumentError(f"min_after_dequeue {m} must be < capacity {self.capacity}")

    # ------------------------------------------------ attaching (§1)

    def check_compatible(self, existing):
        """Raise InvalidArgument unless this declaration may attach to queue `existing` (its declaration).

        Order as TF's MatchesNodeDef: kind, capacity, min_after_dequeue, seed,
        component types, component shapes. Names are not part of identity.
        """
        who = f"Shared queue '{existing.shared_name}'"
        if self.kind != existing.kind:
            raise InvalidArgumentError(f"{who}: expected {existing.kind}, found {self.kind}")
        if self.capacity != existing.capacity and (self.capacity >= 0 or existing.capacity >= 0):
            raise InvalidArgumentError(f"{who} has capacity {existing.capacity} but requested capacity was "
                                       f"{self.capacity}")
        if self.kind == "RandomShuffleQueue":
            if self.min_after_dequeue != existing.min_after_dequeue:
                raise InvalidArgumentError(f"{who} has min_after_dequeue {existing.min_after_dequeue} but requested "
                                           f"min_after_dequeue was {self.min_after_dequeue}.")
            if self.seed is not None and self.seed != existing.seed:
                raise InvalidArgumentError(f"{who} has random seeds ({existing.seed}) but requested seeds are "
                                           f"({self.seed}).")
        if list(self.dtypes) != list(existing.dtypes):
            raise InvalidArgumentError(f"{who} has component types {', '.join(existing.dtypes)} but requested "
                                       f"component types were {', '.join(self.dtypes)}")
        if _shape_lists(self.shapes) != _shape_lists(existing.shapes):
            raise InvalidArgumentError(f"{who} has component shapes {_format_shapes(existing.shapes)} but requested "
                                       f"component shapes were {_format_shapes(self.shapes)}")


def _shape_lists(shapes):
    return None if shapes is None else [list(s) for s in shapes]
