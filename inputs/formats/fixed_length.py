"""Fixed-length binary records, like TensorFlow's FixedLengthRecordDataset, decoded a chunk at a time.

A file is `header_bytes`, then records of `record_bytes` each, then `footer_bytes`
(offsets count in the decompressed stream when the file is GZIP, as in TF). Each
record is decoded by a list of fields, (name, dtype, offset, shape):

    [("label", "uint8", 0), ("image", "uint8", 1, (784,))]

A dtype may carry a byte order ('>i4', '<f4'); values come out in native order.
Without fields a record is one uint8 feature "record" of shape (record_bytes,).
A chunk is decoded with one np.frombuffer over its bytes and a slice per field.
A last record cut short is DataLossError naming the file and its offset; an empty
file holds no records.
"""

from typing import NamedTuple

import numpy as np

from zmqflow.common.wire import dtypes as wire_dtypes
from zmqflow.common.errors import DataLossError, InvalidArgumentError, check_int
from zmqflow.inputs.formats.base import RecordFormat, read_full


class Field(NamedTuple):
    """Where one feature lies in a record: `shape` values of `dtype` from byte `offset`."""

    name: str
    dtype: str
    offset: int
    shape: tuple = ()


def as_field(spec):
    """A Field from a Field, a tuple (name, dtype, offset[, shape]) or a dict of those keys."""
    field = Field(**spec) if isinstance(spec, dict) else Field(*spec)
    shape = (field.shape,) if isinstance(field.shape, int) else tuple(field.shape)
    try:
        dtype = np.dtype(field.dtype)
    except TypeError:
        raise InvalidArgumentError(f"field {field.name!r}: unknown dtype {field.dtype!r}") from None
    if any(d < 0 for d in shape) or field.offset < 0:
        raise InvalidArgumentError(f"field {field.name!r}: offset and shape must be >= 0")
    wire_dtypes.name_of(np.empty(0, dtype.newbyteorder("=")))  # a type the wire can carry
    return Field(field.name, dtype, int(field.offset), shape)


class FixedLengthFormat(RecordFormat):
    """Records of `record_bytes` between a header and a footer; see the module docstring."""

    kind = "fixed_length"

    def __init__(self, record_bytes, fields=None, header_bytes=0, footer_bytes=0,
                 chunk_size=256, compression=None, scale=None):
        for name, value, least in (("record_bytes", record_bytes, 1), ("header_bytes", header_bytes, 0),
                                   ("footer_bytes", footer_bytes, 0)):
            check_int(name, value, least)
        self.record_bytes, self.header_bytes, self.footer_bytes = record_bytes, header_bytes, footer_bytes
        self.fields = [as_field(f) for f in (fields or [("record", "uint8", 0, (record_bytes,))])]
        for f in self.fields:
            end = f.offset + f.dtype.itemsize * int(np.prod(f.shape, dtype=np.int64))
            if end > record_bytes:
                raise InvalidArgumentError(f"field {f.name!r} ends at byte {end}, past the {record_bytes}-byte record")
        if len({f.name for f in self.fields}) != len(self.fields):
            raise InvalidArgumentError("field names must be unique")
        super().__init__(chunk_size, compression, scale)

    def _spec(self):
        return {f.name: (wire_dtypes.name_of(np.empty(0, f.dtype.newbyteorder("="))), f.shape) for f in self.fields}

    def _chunks(self, stream, path):
        rb, footer = self.record_bytes, self.footer_bytes
        step = self.chunk_size * rb
        head = read_full(stream, self.header_bytes)
        buf = read_full(stream, step + footer)
        if not head and not buf:
            return
        if len(head) < self.header_bytes:
            raise DataLossError(f"{path}: the file ends at offset {len(head)}, "
                                f"inside its {self.header_bytes}-byte header")
        self.counters.bytes_read += len(head) + len(buf)
        offset = self.header_bytes  # of buf[0] in the stream
        while True:
            last = len(buf) < step + footer  # the stream ended: buf is the body's tail, then the footer
            body = len(buf) - footer if last else step
            if body < 0:
                raise DataLossError(f"{path}: the file ends at offset {offset + len(buf)}, inside its "
                                    f"{footer}-byte footer")
            count = body // rb
            if count:
                yield self._decode(buf, count), count
            if last:
                if body % rb:
                    raise DataLossError(f"{path}: truncated record at offset {offset + count * rb}: "
                                        f"{body % rb} of {rb} bytes")
                return
            more = read_full(stream, step)
            self.counters.bytes_read += len(more)
            buf = buf[step:] + more
            offset += step

    def _decode(self, buf, count):
        """One array per field from `count` records at the start of `buf`: copies, native byte order."""
        records = np.frombuffer(buf, dtype=np.uint8, count=count * self.record_bytes).reshape(count, -1)
        out = {}
        for f in self.fields:
            size = f.dtype.itemsize * int(np.prod(f.shape, dtype=np.int64))
            values = records[:, f.offset:f.offset + size].copy().view(f.dtype).reshape((count,) + f.shape)
            out[f.name] = values.astype(f.dtype.newbyteorder("="), copy=False)
        return out
