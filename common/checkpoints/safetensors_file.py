"""The safetensors file format: named arrays behind a JSON header, readable by numpy, PyTorch and JAX.

Files are written with the `safetensors` library itself, so what zmqflow writes is what every other
reader expects. They are read back here, without it: its numpy loader has no bfloat16 (ml_dtypes
has), and checkpoints want a clear DataLossError naming the file rather than a library's message.

Layout (https://github.com/huggingface/safetensors): 8 bytes little-endian header size N, N bytes of
JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`, then
the tensors' bytes, offsets relative to the end of the header.
"""

import json
import struct

import numpy as np

from zmqflow.common.wire.dtypes import as_numpy
from zmqflow.common.errors import DataLossError, InvalidArgumentError

METADATA = "__metadata__"
_HEADER_SIZE = struct.Struct("<Q")
_DTYPES = {"F16": "float16", "F32": "float32", "F64": "float64", "BF16": "bfloat16", "I8": "int8", "I16": "int16",
           "I32": "int32", "I64": "int64", "U8": "uint8", "U16": "uint16", "BOOL": "bool"}
"""safetensors dtype codes of zmqflow's numeric dtypes (common/wire/dtypes.py)."""


def encode(tensors, metadata=None):
    """The bytes of a safetensors file holding `tensors` ({name: array}) and `metadata` ({str: str})."""
    from safetensors.numpy import save
    arrays = {}
    for name, array in tensors.items():
        array = np.require(array, requirements="C")  # ascontiguousarray would make a scalar 1-D
        if array.dtype.kind not in "biuf" and array.dtype != as_numpy("bfloat16"):
            raise InvalidArgumentError(f"tensor {name!r}: dtype {array.dtype} cannot be saved as safetensors")
        arrays[name] = array
    return save(arrays, metadata={str(k): str(v) for k, v in (metadata or {}).items()})


def decode(data, path):
    """(metadata, {name: read-only array viewing `data`}) of a safetensors file's bytes.

    DataLossError naming `path` when the header is unreadable or a tensor lies outside the file.
    """
    if len(data) < _HEADER_SIZE.size:
        raise DataLossError(f"safetensors file {path!r} is truncated: {len(data)} bytes")
    (size,) = _HEADER_SIZE.unpack_from(data)
    end = _HEADER_SIZE.size + size
    try:
        if end > len(data):
            raise ValueError(f"its header of {size} bytes runs past the end of the file ({len(data)} bytes)")
        header = json.loads(bytes(data[_HEADER_SIZE.size:end]))
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        metadata = header.pop(METADATA, None) or {}
        buffer = memoryview(data)[end:]
        tensors = {name: _tensor(name, entry, buffer) for name, entry in header.items()}
    except RecursionError:   # JSON nested deeper than Python's stack: no header of ours, a crafted one
        raise DataLossError(f"safetensors file {path!r} is corrupt: its header is nested too deeply") from None
    except (ValueError, TypeError, KeyError) as exc:
        raise DataLossError(f"safetensors file {path!r} is corrupt: {exc}") from exc
    return metadata, tensors


def _tensor(name, entry, buffer):
    dtype = as_numpy(_DTYPES[entry["dtype"]]) if entry.get("dtype") in _DTYPES else None
    if dtype is None:
        raise ValueError(f"tensor {name!r} has dtype {entry.get('dtype')!r}, not one zmqflow reads")
    shape = tuple(int(d) for d in entry["shape"])
    begin, stop = (int(o) for o in entry["data_offsets"])
    count = int(np.prod(shape, dtype=np.int64))
    if not 0 <= begin <= stop <= len(buffer) or stop - begin != count * dtype.itemsize:
        raise ValueError(f"tensor {name!r} ({entry['dtype']} {list(shape)}) has bytes [{begin}, {stop}) "
                         f"outside the {len(buffer)} data bytes or of the wrong size")
    return np.frombuffer(buffer[begin:stop], dtype=dtype).reshape(shape)
