"""The tensor element types that cross the wire, by TensorFlow's names.

Numeric types map to numpy dtypes (bfloat16 through ml_dtypes, the package
TensorFlow and JAX use for it). `string` tensors are numpy object arrays of
`bytes`: file names, CSV lines, serialized records.

ml_dtypes is imported when bfloat16 is first named or met, not with this module: it costs every process
~1.7 MB (its extension's pages and its finfo tables) and ~10 ms, and only a --bf16 job sends bfloat16.
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError

STRING = "string"
BFLOAT16 = "bfloat16"


class _Numeric(dict):
    """{wire name: numpy dtype}; bfloat16's entry is made from ml_dtypes on its first lookup."""

    def __missing__(self, name):
        if name != BFLOAT16:
            raise KeyError(name)
        import ml_dtypes
        dt = np.dtype(ml_dtypes.bfloat16)
        self[name] = dt
        _NAME_OF[dt] = name
        return dt


_NUMERIC = _Numeric({
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8),
    "int16": np.dtype(np.int16),
    "int32": np.dtype(np.int32),
    "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8),
    "uint16": np.dtype(np.uint16),
    "bool": np.dtype(np.bool_),
})

DTYPE_NAMES = ("float16", "float32", "float64", BFLOAT16, "int8", "int16", "int32", "int64", "uint8", "uint16",
               "bool", STRING)
_NAME_OF = {dt: name for name, dt in _NUMERIC.items()}   # bfloat16's added with its dtype


def check_name(name):
    """Return `name` if it is a supported dtype name, else InvalidArgument."""
    if not isinstance(name, str) or name not in DTYPE_NAMES:
        raise InvalidArgumentError(f"unsupported dtype {name!r}; expected one of {', '.join(DTYPE_NAMES)}")
    return name


def as_numpy(name):
    """The numpy dtype that holds values of dtype `name` (object for strings)."""
    if name == STRING:
        return np.dtype(object)
    return _NUMERIC[check_name(name)]


def name_of(array):
    """The wire name of a numpy array's dtype; bytes/str arrays are `string`."""
    dt = array.dtype
    if dt in _NAME_OF:
        return _NAME_OF[dt]
    if dt.kind in ("O", "S", "U"):
        return STRING
    if dt.name == BFLOAT16 and dt == _NUMERIC[BFLOAT16]:   # made by the caller's ml_dtypes, before any lookup here
        return BFLOAT16
    raise InvalidArgumentError(f"unsupported numpy dtype {dt}")


def is_bfloat16(dt):
    """Whether `dt` is bfloat16, asked without importing ml_dtypes (a dtype of that name only it makes)."""
    return dt.name == BFLOAT16 and dt == _NUMERIC[BFLOAT16]


def to_array(value, name):
    """`value` as an ndarray of dtype `name`.

    Python scalars and lists are converted, as TensorFlow converts them to the
    declared dtype; a numpy array of another dtype is refused (no silent casts,
    int64 -> int32 included).
    """
    if name == STRING:
        return _as_bytes_array(np.asarray(value, dtype=object))
    if not isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value, dtype=_NUMERIC[name])
    arr = np.asarray(value)
    if arr.dtype != _NUMERIC[name]:
        raise InvalidArgumentError(f"expected dtype {name}, got {name_of_or_str(arr.dtype)}")
    return arr


def name_of_or_str(dt):
    return _NAME_OF.get(dt, str(dt))


def _as_bytes_array(arr):
    """Object array whose elements are all bytes (str is UTF-8 encoded)."""
    out = np.empty(arr.shape, dtype=object)
    flat_in, flat_out = arr.reshape(-1), out.reshape(-1)
    for i, item in enumerate(flat_in):
        if isinstance(item, str):
            item = item.encode("utf-8")
        elif isinstance(item, np.bytes_):
            item = bytes(item)
        elif not isinstance(item, bytes):
            raise InvalidArgumentError(f"string tensors hold bytes or str, got {type(item).__name__}")
        flat_out[i] = item
    return out


def zero_value(name):
    """The padding value of dtype `name`: 0, 0.0, False or b''."""
    return b"" if name == STRING else _NUMERIC[name].type(0)
