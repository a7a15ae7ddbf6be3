"""The first checkpoint format ("zmqflow-checkpoint-1"), read so that old checkpoints still restore.

Each piece was one file of consecutive .npy records, the value then each slot in manifest order,
with its crc32 and size in the manifest. Nothing writes it any more: `zmqflow checkpoint convert`
turns such a checkpoint into the safetensors one.
"""

import io
import zlib

import numpy as np

from zmqflow.common.wire.dtypes import as_numpy
from zmqflow.common.errors import DataLossError

FORMAT = "zmqflow-checkpoint-1"


def read_checked(path, size, crc32):
    """The bytes of a checkpoint file, checked against the manifest's size and crc32 (either format)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise DataLossError(f"checkpoint file {path!r} cannot be read: {exc}") from exc
    if len(data) != size or zlib.crc32(data) != crc32:
        raise DataLossError(f"checkpoint file {path!r} is truncated or corrupt: {len(data)} bytes, crc32 "
                            f"{zlib.crc32(data)}; the manifest says {size} bytes, crc32 {crc32}")
    return data


def load_npy_piece(path, piece):
    """[value, *slots] of one piece file at `path` (Checkpoint._file_path: inside the checkpoint), checked
    against the manifest's size, checksum, shape and dtype."""
    data = read_checked(path, piece["bytes"], piece["crc32"])
    stream, dtype, arrays = io.BytesIO(data), as_numpy(piece["dtype"]), []
    try:
        for _ in range(1 + len(piece["slots"])):
            array = np.load(stream, allow_pickle=False)
            if array.dtype != dtype and array.dtype.kind == "V":  # bfloat16 was saved as raw bytes
                array = array.view(dtype)
            if array.shape != tuple(piece["shape"]) or array.dtype != dtype:
                raise ValueError(f"holds {array.dtype} {list(array.shape)}")
            arrays.append(array)
    except (ValueError, EOFError, OSError) as exc:
        raise DataLossError(f"checkpoint file {path!r} is corrupt: {exc}") from exc
    return arrays
