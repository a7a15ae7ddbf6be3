"""PaddingFIFOQueue: a FIFOQueue whose shapes may have unknown dims, padded per batch (§4).

Elements are checked for rank and known dims; a batch dequeue pads each
unknown dim to the maximum over that batch's elements with the dtype's zero
(0, 0.0, False, b''). A single dequeue returns the element unpadded.
"""

import math

import numpy as np

from zmqflow.common.wire import dtypes as wire_dtypes
from zmqflow.common.wire.limits import DEFAULT_LIMITS
from zmqflow.services.broker.queues.base import stack
from zmqflow.services.broker.queues.declaration import format_shape
from zmqflow.services.broker.queues.fifo import FIFOQueue


class PaddingFIFOQueue(FIFOQueue):
    """FIFO order; batches padded with zeros to the largest element of the batch."""

    kind = "PaddingFIFOQueue"

    def __init__(self, decl, name, quota=None):
        super().__init__(decl, name, quota)
        self._known = tuple(tuple((a, d) for a, d in enumerate(s) if d is not None) for s in self._shapes)
        self._fully_defined = tuple(None not in s for s in self._shapes)
        self._zeros = tuple(wire_dtypes.zero_value(d) for d in decl.dtypes)

    def _check_shape(self, i, shape, batch=None):
        expected = self._shapes[i]
        if len(shape) != len(expected) or any(shape[a] != d for a, d in self._known[i]):
            self._shape_mismatch(i, expected, shape, batch)

    def _batch(self, held):
        out = []
        for i, dtype in enumerate(self._dtypes):
            parts = [e[i] for e in held]
            if self._fully_defined[i]:
                out.append(stack(parts, dtype))
                continue
            shapes = [p.shape for p in parts]
            dims = tuple(max(ds) for ds in zip(*shapes))
            if all(s == dims for s in shapes):
                out.append(stack(parts, dtype))
                continue
            if len(parts) * math.prod(dims) * dtype.itemsize > DEFAULT_LIMITS.max_message_bytes:
                raise ValueError(f"padded component {i} would be {format_shape((len(parts),) + dims)}, larger than "
                                 f"{DEFAULT_LIMITS.max_message_bytes} bytes")
            batch = np.full((len(parts),) + dims, self._zeros[i], dtype=dtype)
            for j, p in enumerate(parts):
                batch[(j,) + tuple(slice(0, d) for d in p.shape)] = p  # the element at its slot's origin
            out.append(batch)
        return out
