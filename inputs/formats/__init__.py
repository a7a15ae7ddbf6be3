"""File formats of the reader service: one interface over CSV, fixed-length records and TFRecord.

Plain code, no sockets. A format object is made once from its options and reads
any number of files, streaming each in chunks so memory stays flat:

    fmt = open_format("csv", record_defaults=[[0.0]] * 784 + [[0]],
                      columns={"image": range(784), "label": 784}, scale={"image": 1 / 255})
    fmt.spec                   # {"image": ("float32", (784,)), "label": ("int32", ())}: declare the queue first
    for chunk in fmt.read(path):                     # Chunk(features, count, path, start)
        queue.enqueue_many(chunk.tensors(["image", "label"]))   # arrays [count, *shape]
    fmt.counters               # Counters(records_read, bytes_read, malformed_skipped), cumulative

The same for every kind:
  read(path) -> iterator of Chunk   at most `chunk_size` instances each, in file order; features maps
                                    name -> np.ndarray with a leading dimension of `count`
                                    (strings: object arrays of bytes; VarLenFeature: object arrays of 1-D arrays)
  instances(path) -> iterator of dict  one instance at a time, without the batch dimension
  spec -> {name: (dtype name, shape)}  per instance, known before reading (None in a shape: ragged)
  counters                           records_read, bytes_read (of the decompressed stream), malformed_skipped

Options every kind takes: chunk_size (default 256); compression (None infers GZIP from a
'.gz' suffix, '' none, 'GZIP'); scale ({feature: factor}: the feature is multiplied by
factor and becomes float32 if it was not float). Options of each kind: CsvFormat,
FixedLengthFormat, TFRecordFormat.

Errors: NotFoundError for a missing file; InvalidArgumentError for bad options, a malformed
CSV line (naming file:line) or an Example that does not match the spec (naming the
offset); DataLossError for corrupt or truncated records and bad GZIP streams (naming the
file and offset).
"""

import inspect

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.inputs.formats.base import Chunk, Counters, RecordFormat
from zmqflow.inputs.formats.csv_format import CsvFormat
from zmqflow.inputs.formats.fixed_length import Field, FixedLengthFormat
from zmqflow.inputs.formats.tfrecord import (FixedLenFeature, TFRecordFormat, VarLenFeature, iter_records,
                                              make_example, write_tfrecord)

FORMATS = {"csv": CsvFormat, "fixed_length": FixedLengthFormat, "tfrecord": TFRecordFormat}


def open_format(kind, **options):
    """A format object of `kind` ('csv' | 'fixed_length' | 'tfrecord') with its options checked."""
    if kind not in FORMATS:
        raise InvalidArgumentError(f"unknown file format {kind!r}; expected one of {', '.join(FORMATS)}")
    cls = FORMATS[kind]
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as e:
        raise InvalidArgumentError(f"format {kind!r}: {e}") from None
    return cls(**options)


__all__ = ["FORMATS", "Chunk", "Counters", "CsvFormat", "Field", "FixedLenFeature", "FixedLengthFormat",
           "RecordFormat", "TFRecordFormat", "VarLenFeature", "iter_records", "make_example", "open_format",
           "write_tfrecord"]
