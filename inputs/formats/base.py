"""What every file format shares: chunks, counters, (de)compressed input, scaling.

A format turns one file into a stream of `Chunk`s of at most `chunk_size`
instances, reading it in bounded pieces so memory stays flat whatever the file
size. A subclass implements only `_spec()` and `_chunks(stream, path)`.
"""

import dataclasses
import gzip
import os
import zlib
from dataclasses import dataclass

import numpy as np

from zmqflow.common.errors import DataLossError, InvalidArgumentError, NotFoundError, check_int

COMPRESSIONS = ("", "GZIP")
_READ_PIECE = 1 << 24  # never ask a stream for more than 16 MiB at once: a corrupt length must not allocate it


@dataclass
class Chunk:
    """`count` instances of one file: feature name -> array whose first dimension is `count`.

    `start` is the index in the file of the first instance, so a reader can say where it is.
    """

    features: dict
    count: int
    path: str = ""
    start: int = 0

    def tensors(self, names):
        """The arrays in the order of `names`: the components of an enqueue_many."""
        return [self.features[name] for name in names]


@dataclass
class Counters:
    """Cumulative over every `read()` of one format object; bytes are of the decompressed stream."""

    records_read: int = 0
    bytes_read: int = 0
    malformed_skipped: int = 0

    def as_dict(self):
        return dataclasses.asdict(self)


def resolve_compression(path, compression):
    """TF's compression_type ('' or 'GZIP'; 'NONE' accepted); None infers GZIP from a '.gz' suffix."""
    if compression is None:
        return "GZIP" if str(path).endswith(".gz") else ""
    value = str(compression).upper()
    value = "" if value == "NONE" else value
    if value not in COMPRESSIONS:
        raise InvalidArgumentError(f"unsupported compression {compression!r}; expected None, '' or 'GZIP'")
    return value


def open_input(path, compression):
    """A binary stream of the file's (decompressed) bytes; a missing file is NotFoundError."""
    try:
        return gzip.open(path, "rb") if compression == "GZIP" else open(path, "rb")
    except FileNotFoundError:
        raise NotFoundError(f"{path}: no such file") from None


def read_full(stream, size):
    """Up to `size` bytes: fewer only at the end of the stream. Reads in bounded pieces."""
    parts, left = [], size
    while left > 0:
        piece = stream.read(min(left, _READ_PIECE))
        if not piece:
            break
        parts.append(piece)
        left -= len(piece)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class RecordFormat:
    """The interface of every format: `spec`, `read(path)`, `instances(path)`, `counters`."""

    kind = ""

    def __init__(self, chunk_size=256, compression=None, scale=None):
        check_int("chunk_size", chunk_size, 1)
        if compression is not None:
            resolve_compression("", compression)
        self.chunk_size = chunk_size
        self.compression = compression
        self.scale = {name: float(factor) for name, factor in (scale or {}).items()}
        self.counters = Counters()
        spec = self._spec()
        for name in self.scale:
            if name not in spec or spec[name][0] == "string" or None in spec[name][1]:
                raise InvalidArgumentError(f"scale: {name!r} is not a fixed-shape numeric feature of this format")

    @property
    def spec(self):
        """Feature name -> (dtype name, per-instance shape), known before any file is read (None: ragged)."""
        spec = self._spec()
        for name in self.scale:
            dtype, shape = spec[name]
            spec[name] = (dtype if dtype.startswith("float") else "float32", shape)
        return spec

    def read(self, path):
        """Chunks of at most `chunk_size` instances, in file order; the file is closed when iteration stops."""
        path = os.fspath(path)
        start = 0
        with open_input(path, resolve_compression(path, self.compression)) as stream:
            try:
                for features, count in self._chunks(stream, path):
                    self._apply_scale(features)
                    self.counters.records_read += count
                    yield Chunk(features, count, path, start)
                    start += count
            except (EOFError, zlib.error, gzip.BadGzipFile) as e:
                raise DataLossError(f"{path}: corrupt compressed stream: {e}") from e

    def instances(self, path):
        """One instance at a time (feature -> array without the batch dimension): for tests and tools."""
        for chunk in self.read(path):
            for i in range(chunk.count):
                yield {name: values[i] for name, values in chunk.features.items()}

    def _apply_scale(self, features):
        for name, factor in self.scale.items():
            values = features[name]
            if values.dtype.kind == "f":
                values *= values.dtype.type(factor)
            else:  # computed in float64, rounded once to float32
                features[name] = (values * factor).astype(np.float32)

    def _spec(self):
        raise NotImplementedError

    def _chunks(self, stream, path):
        """Yield (features, count) from an open binary stream."""
        raise NotImplementedError
