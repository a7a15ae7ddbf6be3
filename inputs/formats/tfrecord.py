"""TFRecord files and tf.train.Example, read and written as TensorFlow does, without TensorFlow.

Each record is framed as

    uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)     (little-endian)

with masked_crc(x) = ((crc >> 15 | crc << 17) + 0xa282ead8) mod 2**32 over CRC-32C.
Both checksums are checked; a corrupt or truncated record is DataLossError naming
the file and the record's byte offset (in the decompressed stream for GZIP files), as is a
record longer than `max_record_bytes` (MAX_RECORD_BYTES, 256 MiB, by default), refused before
anything is read for it: a length field of 2**60 must not become an allocation.

Records are parsed as tf.train.Example by a spec like TF's parse_example:
{"image": FixedLenFeature([784], "float32"), "label": FixedLenFeature([], "int64", 0),
"tags": VarLenFeature("string")} (or, from a config file, {"shape": [784], "dtype": "float32"}
and {"dtype": "string"}). dtypes are TF's "float32", "int64" and "string"; another numeric
dtype is cast from the list of its kind (int32 from an int64_list, float64 from a
float_list), a value out of its range being InvalidArgumentError. A FixedLenFeature gives an array [count, *shape];
a VarLenFeature gives an object array [count] of 1-D arrays (a ragged batch). Without a
spec each record is one "record" feature of bytes, as TFRecordDataset gives.

The Example message classes are built at import from a FileDescriptorProto in text
form (the field numbers and types of TF's example.proto and feature.proto) in a
private descriptor pool, so no protoc, no generated code, and no clash with TF's own.
"""

import gzip as _gzip
import struct
from typing import NamedTuple

import google_crc32c
import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf.message import DecodeError

from zmqflow.common.errors import DataLossError, InvalidArgumentError
from zmqflow.inputs.formats.base import RecordFormat, open_input, read_full, resolve_compression

_EXAMPLE_PROTO = """
name: "zmqflow/tensorflow_example.proto"  package: "tensorflow"  syntax: "proto3"
message_type { name: "BytesList"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_BYTES } }
message_type { name: "FloatList"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_FLOAT options { packed: true } } }
message_type { name: "Int64List"
  field { name: "value" number: 1 label: LABEL_REPEATED type: TYPE_INT64 options { packed: true } } }
message_type { name: "Feature"
  oneof_decl { name: "kind" }
  field { name: "bytes_list" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".tensorflow.BytesList" oneof_index: 0 }
  field { name: "float_list" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".tensorflow.FloatList" oneof_index: 0 }
  field { name: "int64_list" number: 3 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".tensorflow.Int64List" oneof_index: 0 } }
message_type { name: "Features"
  field { name: "feature" number: 1 label: LABEL_REPEATED type: TYPE_MESSAGE type_name: ".tensorflow.Features.FeatureEntry" }
  nested_type { name: "FeatureEntry" options { map_entry: true }
    field { name: "key" number: 1 label: LABEL_OPTIONAL type: TYPE_STRING }
    field { name: "value" number: 2 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".tensorflow.Feature" } } }
message_type { name: "Example"
  field { name: "features" number: 1 label: LABEL_OPTIONAL type: TYPE_MESSAGE type_name: ".tensorflow.Features" } }
"""


def _message_class(pool, name):
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tensorflow.{name}"))


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(text_format.Parse(_EXAMPLE_PROTO, descriptor_pb2.FileDescriptorProto()))
Example, Feature = _message_class(_POOL, "Example"), _message_class(_POOL, "Feature")


class FixedLenFeature(NamedTuple):
    """As tf.io.FixedLenFeature: exactly prod(shape) values; `default_value` when the key is absent."""

    shape: tuple
    dtype: str
    default_value: object = None


class VarLenFeature(NamedTuple):
    """As tf.io.VarLenFeature: any number of values, as one 1-D array per instance."""

    dtype: str


def masked_crc32c(data):
    """TFRecord's checksum: CRC-32C, rotated and offset so CRCs of CRCs stay strong."""
    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data):
    """One record as it lies in a TFRecord file."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))


MAX_RECORD_BYTES = 256 * 1024 * 1024


def framed_records(stream, path, max_record_bytes=MAX_RECORD_BYTES):
    """(offset, data) of each record of an open stream, both checksums checked, none over `max_record_bytes`."""
    offset = 0
    while head := read_full(stream, 12):
        if len(head) < 12:
            raise DataLossError(f"{path}: truncated record at offset {offset}: header of {len(head)} of 12 bytes")
        length, length_crc = struct.unpack("<QI", head)
        if masked_crc32c(head[:8]) != length_crc:
            raise DataLossError(f"{path}: corrupted record at offset {offset}: length checksum mismatch")
        if length > max_record_bytes:
            raise DataLossError(f"{path}: record at offset {offset} of {length} bytes is over the maximum record "
                                f"size ({max_record_bytes} bytes, max_record_bytes)")
        body = read_full(stream, length + 4)
        if len(body) < length + 4:
            raise DataLossError(f"{path}: truncated record at offset {offset}: "
                                f"{len(body)} of {length + 4} bytes after the header")
        data = body[:length]
        if masked_crc32c(data) != struct.unpack("<I", body[length:])[0]:
            raise DataLossError(f"{path}: corrupted record at offset {offset}: data checksum mismatch")
        yield offset, data
        offset += 16 + length


def iter_records(path, compression=None, max_record_bytes=MAX_RECORD_BYTES):
    """The serialized records of a TFRecord file, like tf.data.TFRecordDataset."""
    with open_input(path, resolve_compression(path, compression)) as stream:
        for _, data in framed_records(stream, path, max_record_bytes):
            yield data


def _feature(value):
    """A tf.train.Feature: floats -> float_list, ints/bools -> int64_list, bytes/str -> bytes_list.

    An empty value is a Feature with no list set, which a parser takes as empty whatever its type.
    """
    feature = Feature()
    if np.size(value) == 0 and not isinstance(value, (bytes, str)):
        return feature
    if isinstance(value, (bytes, str)):
        value = [value]
    if isinstance(value, np.ndarray) and value.dtype.kind in "OSU":
        value = value.ravel().tolist()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, (bytes, str)) for v in value):
        feature.bytes_list.value.extend(v.encode() if isinstance(v, str) else v for v in value)
        return feature
    array = np.asarray(value)
    if array.dtype.kind == "f":
        feature.float_list.value.extend(array.ravel().tolist())
    elif array.dtype.kind in "iub":
        feature.int64_list.value.extend(array.ravel().astype(np.int64).tolist())
    else:
        raise InvalidArgumentError(f"cannot store a value of dtype {array.dtype} in a tf.train.Feature")
    return feature


def make_example(features):
    """A tf.train.Example from {name: value}; see `_feature` for how values map to lists."""
    example = Example()
    for name, value in features.items():
        example.features.feature[name].CopyFrom(_feature(value))
    return example


def write_tfrecord(path, examples, gzip=False):
    """Write records (bytes, Example messages or {name: value} dicts); returns how many."""
    count = 0
    with (_gzip.open(path, "wb") if gzip else open(path, "wb")) as out:
        for example in examples:
            if isinstance(example, dict):
                example = make_example(example)
            out.write(frame(example if isinstance(example, bytes) else example.SerializeToString()))
            count += 1
    return count


_LISTS = {"f": "float_list", "i": "int64_list", "u": "int64_list", "b": "int64_list", "O": "bytes_list"}


class _Parser:
    """How one spec entry reads its values from a Feature and stores them for a chunk."""

    def __init__(self, name, spec):
        if isinstance(spec, dict):  # from a config file: with a shape it is fixed-length, else var-length
            spec = FixedLenFeature(**spec) if "shape" in spec else VarLenFeature(**spec)
        if not isinstance(spec, (FixedLenFeature, VarLenFeature)):
            raise InvalidArgumentError(f"feature {name!r}: expected a FixedLenFeature or a VarLenFeature, got {spec!r}")
        try:
            is_string = spec.dtype in (bytes, str) or isinstance(spec.dtype, str) and spec.dtype == "string"
            dtype = np.dtype(object) if is_string else np.dtype(spec.dtype)
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind not in _LISTS:
            raise InvalidArgumentError(f"feature {name!r}: unsupported dtype {spec.dtype!r}")
        self.name, self.dtype, self.list = name, dtype, _LISTS[dtype.kind]
        self.varlen = isinstance(spec, VarLenFeature)
        if self.varlen:
            self.shape = (None,)
        else:
            self.shape = (int(spec.shape),) if isinstance(spec.shape, int) else tuple(int(d) for d in spec.shape)
            if any(d < 0 for d in self.shape):
                raise InvalidArgumentError(f"feature {name!r}: a FixedLenFeature needs a fully defined shape")
        self.size = 0 if self.varlen else int(np.prod(self.shape, dtype=np.int64))
        self.default = None
        if not self.varlen and spec.default_value is not None:
            try:
                self.default = np.broadcast_to(np.asarray(spec.default_value, dtype=dtype), self.shape)
            except (ValueError, TypeError, OverflowError) as e:
                raise InvalidArgumentError(f"feature {name!r}: bad default_value: {e}") from None

    def allocate(self, count):
        return np.empty(count, dtype=object) if self.varlen else np.empty((count,) + self.shape, dtype=self.dtype)

    def fill(self, out, i, features):
        """Store instance i's value from `features` (an Example's map); a mismatch raises ValueError."""
        if self.name not in features:
            if self.varlen:
                out[i] = np.empty(0, dtype=self.dtype)
            elif self.default is None:
                raise ValueError(f"required feature {self.name!r} is missing")
            else:
                out[i, ...] = self.default
            return
        feature = features[self.name]
        kind = feature.WhichOneof("kind")
        if kind not in (None, self.list):
            raise ValueError(f"feature {self.name!r} is a {kind}, expected a {self.list}")
        values = self._array(getattr(feature, self.list).value if kind else [])
        if self.varlen:
            out[i] = values
        elif len(values) != self.size:
            raise ValueError(f"feature {self.name!r} has {len(values)} values, expected {self.size}")
        else:
            out[i, ...] = values.reshape(self.shape)

    def _array(self, values):
        """The values as self.dtype; an int64 that the narrower type cannot hold raises (numpy would wrap)."""
        if self.dtype.kind not in "iub" or self.dtype == np.int64:
            return np.array(values, dtype=self.dtype)
        wide = np.array(values, dtype=np.int64)
        narrow = wide.astype(self.dtype)
        if not np.array_equal(narrow, wide):
            raise ValueError(f"feature {self.name!r}: a value is out of the range of {self.dtype}")
        return narrow


class TFRecordFormat(RecordFormat):
    """TFRecord files of tf.train.Example (or raw records without `features`); see the module docstring."""

    kind = "tfrecord"

    def __init__(self, features=None, chunk_size=256, compression=None, scale=None, max_record_bytes=MAX_RECORD_BYTES):
        self._parsers = None if features is None else [_Parser(n, s) for n, s in dict(features).items()]
        self.max_record_bytes = max_record_bytes
        super().__init__(chunk_size, compression, scale)

    def _spec(self):
        if self._parsers is None:
            return {"record": ("string", ())}
        return {p.name: ("string" if p.dtype.kind == "O" else p.dtype.name, p.shape) for p in self._parsers}

    def _chunks(self, stream, path):
        batch, offsets = [], []
        for offset, data in framed_records(stream, path, self.max_record_bytes):
            self.counters.bytes_read += 16 + len(data)
            batch.append(data)
            offsets.append(offset)
            if len(batch) == self.chunk_size:
                yield self._parse(batch, offsets, path), len(batch)
                batch, offsets = [], []
        if batch:
            yield self._parse(batch, offsets, path), len(batch)

    def _parse(self, batch, offsets, path):
        if self._parsers is None:
            records = np.empty(len(batch), dtype=object)
            records[:] = batch
            return {"record": records}
        out = {p.name: p.allocate(len(batch)) for p in self._parsers}
        for i, data in enumerate(batch):
            try:
                features = Example.FromString(data).features.feature
                for p in self._parsers:
                    p.fill(out[p.name], i, features)
            except DecodeError as e:
                raise InvalidArgumentError(f"{path}: record at offset {offsets[i]}: not a tf.train.Example") from e
            except (ValueError, OverflowError) as e:
                raise InvalidArgumentError(f"{path}: record at offset {offsets[i]}: {e}") from e
        return out
