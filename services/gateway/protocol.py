"""The Open Inference Protocol's infer request and response bodies: JSON tensors and the binary tensor extension.

Why here and not in the HTTP app: decoding and checking a request against a model's metadata, and
encoding the answer, is the protocol's logic, testable without a server. A request body is a JSON
object, or (binary extension) a JSON header of `Inference-Header-Content-Length` bytes followed by
the raw tensors, each input saying its size in `parameters.binary_data_size`. Every mistake is an
InvalidArgumentError that names the input and what was expected, which the app answers with 400.
A model trained on a data spec also takes its raw columns instead of its tensors: one input per
column, shape [n] (or [n, 1]), BYTES for a categorical column (JSON strings, or Triton's binary
form: each element's length as 4 little-endian bytes, then its bytes), numbers for a numeric one.
Bodies are parsed with orjson (the http extra): the standard library's parser took 256 us for one
MNIST row of 784 numbers, a quarter of the gateway's whole overhead budget; orjson takes 21 us.
"""

import json
import math
import re
import struct
from dataclasses import dataclass

import numpy as np
import orjson

from zmqflow.common.errors import InvalidArgumentError

HEADER_LENGTH = "Inference-Header-Content-Length"
DEADLINE_HEADER = "X-Zmqflow-Deadline-Ms"
MAX_DEADLINE_MS = 24 * 3600 * 1000
"""The longest deadline a request may set (a day): beyond it a timer or the wire's integers would overflow."""

NUMPY_OF = {"BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
            "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
            "FP32": np.float32, "FP64": np.float64}
"""Datatypes this gateway decodes (a model's inputs are numbers; BYTES and BF16 have no numpy twin here)."""


@dataclass
class InferRequest:
    id: object               # echoed in the response when given
    inputs: list             # one array per model input, in the model's order
    parameters: dict         # the request's parameters (timeout, binary_data_output, ...)
    binary_outputs: dict     # output name -> whether it is answered as binary data
    records: dict = None     # raw columns {column: [values]} instead of inputs (a model trained on a data spec)


def parse_infer(body, header_length, model):
    """The InferRequest in `body` (bytes) for `model` (catalog.ServedModel); `header_length` is the
    Inference-Header-Content-Length header (None: the whole body is JSON)."""
    json_end = _json_end(body, header_length)
    request = _loads(body[:json_end])
    parameters = _parameters(request.get("parameters"), "request")
    inputs = request.get("inputs")
    if raw_columns(inputs, model):
        return _parse_columns(request, inputs, model, body, json_end, parameters)
    specs = {spec.name: spec for spec in model.inputs}
    if not isinstance(inputs, list) or not inputs:
        raise InvalidArgumentError(f"the request needs \"inputs\": a list of {len(specs)} tensor(s) "
                                   f"({', '.join(specs)}) for model {model.name!r}")
    arrays, offset = {}, json_end
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise InvalidArgumentError(f"inputs[{i}] must be an object with name, shape, datatype and data")
        name = checked_name(i, _name(tensor), specs, arrays, model)
        arrays[name], offset = _input_array(tensor, specs[name], body, offset)
    check_complete(arrays, specs, len(body) - offset, f"model {model.name!r} needs input(s)", "")
    return InferRequest(request.get("id"), [arrays[name] for name in specs], parameters,
                        _binary_outputs(request.get("outputs"), parameters, model))


def checked_name(i, name, specs, given, model):
    """`name`, the name of request input `i`, when it is one of the model's inputs (`specs`) not `given` yet."""
    if name not in specs:
        raw = f"; or its raw columns: {', '.join(c.name for c in model.columns)}" if model.columns else ""
        raise InvalidArgumentError(f"inputs[{i}]: model {model.name!r} has no input {name!r:.80} "
                                   f"(its inputs: {', '.join(specs)}{raw})")
    if name in given:
        raise InvalidArgumentError(f"inputs[{i}]: input {name!r} is given twice")
    return name


def _name(tensor):
    """A tensor's name when it is a string (a list or object for a name is no name: never a key looked up)."""
    name = tensor.get("name") if isinstance(tensor, dict) else None
    return name if isinstance(name, str) else None


def check_complete(given, specs, left_over, needs, hint):
    """Every binary byte accounted for, every input of `specs` given, all with one number of rows."""
    if left_over:
        raise InvalidArgumentError(f"the body holds {left_over} byte(s) of binary data that no input's "
                                   "binary_data_size accounts for")
    missing = [name for name in specs if name not in given]
    if missing:
        raise InvalidArgumentError(f"{needs} {', '.join(map(repr, missing))}{hint}")
    rows = {len(values) for values in given.values()}
    if len(rows) != 1:
        raise InvalidArgumentError(f"every input needs the same number of rows (the first dimension), got {sorted(rows)}")


def raw_columns(inputs, model):
    """Whether the request sends raw columns: every input is named by one, none by a tensor input."""
    if not model.columns or not isinstance(inputs, list) or not inputs:
        return False
    names = [_name(tensor) for tensor in inputs]
    columns, tensors = {c.name for c in model.columns}, {spec.name for spec in model.inputs}
    return all(name in columns for name in names) and not any(name in tensors for name in names)


def _parse_columns(request, inputs, model, body, offset, parameters):
    """The InferRequest of a raw-columns request: records {column: [values]} for the model server, which
    makes them into the model's inputs with the statistics of training (and checks the values)."""
    specs = {spec.name: spec for spec in model.columns}
    records = {}
    for tensor in inputs:
        name = tensor["name"]
        if name in records:
            raise InvalidArgumentError(f"column {name!r} is given twice")
        records[name], offset = _column_values(tensor, specs[name], body, offset)
    check_complete(records, specs, len(body) - offset, f"model {model.name!r} needs raw column(s)",
                    f" (its raw columns: {', '.join(specs)})")
    return InferRequest(request.get("id"), [], parameters,
                        _binary_outputs(request.get("outputs"), parameters, model, records=True), records)


def _column_values(tensor, spec, body, offset):
    """(list of str or float, offset after its binary data) of one raw column of shape [n] or [n, 1]."""
    name, datatype, shape = spec.name, tensor.get("datatype"), tensor.get("shape")
    rows = checked_column(spec, datatype, shape)
    size = _parameters(tensor.get("parameters"), f"input {name!r}").get("binary_data_size")
    if size is not None:
        if "data" in tensor:
            raise InvalidArgumentError(f"input {name!r} has both \"data\" and binary_data_size")
        if type(size) is not int or size < 0 or offset + size > len(body):
            raise InvalidArgumentError(f"input {name!r}: binary_data_size must be a number of bytes within the body, "
                                       f"got {size!r:.40}")
        raw = body[offset:offset + size]
        if datatype == "BYTES":
            values = decode_bytes_elements(raw, rows, name)
        else:
            dtype = np.dtype(NUMPY_OF[datatype]).newbyteorder("<")
            if size != rows * dtype.itemsize:
                raise InvalidArgumentError(f"input {name!r}: binary_data_size must be {rows * dtype.itemsize} bytes "
                                           f"({datatype} {shape}), got {size}")
            values = np.frombuffer(raw, dtype).tolist()
        return values, offset + size
    data = tensor.get("data")
    if not isinstance(data, list):
        raise InvalidArgumentError(f"input {name!r} needs \"data\" (a list of {rows} values) or binary_data_size")
    values = [v for row in data for v in row] if data and all(isinstance(v, list) for v in data) else data
    if len(values) != rows:
        raise InvalidArgumentError(f"column {name!r}: shape {shape} needs {rows} values, data holds {len(values)}")
    wanted = str if datatype == "BYTES" else (int, float)
    bad = next((v for v in values if not isinstance(v, wanted) or isinstance(v, bool)), _NONE)
    if bad is not _NONE:
        raise InvalidArgumentError(f"column {name!r}: {bad!r:.40} is not {'a string' if datatype == 'BYTES' else 'a number'}")
    if datatype != "BYTES":
        values = numbers(values, datatype, f"column {name!r}", shape).tolist()
    return values, offset


_NONE = object()


_LENGTH = struct.Struct("<I")


def decode_bytes_elements(raw, rows, name):
    """The `rows` strings of a binary BYTES tensor: each a 4-byte little-endian length, then its UTF-8 bytes.
    One tight loop (struct, errors checked once outside it): 0.29 s for 8 MiB of short strings, where
    the checks and int.from_bytes of each element took 0.53 s (best of 3; the app runs it on a thread)."""
    if rows > len(raw) // 4:
        raise InvalidArgumentError(f"input {name!r}: {rows} element(s) need at least {4 * rows} bytes of binary "
                                   f"BYTES data, got {len(raw)}")
    values, at, unpack = [None] * rows, 0, _LENGTH.unpack_from
    try:
        for i in range(rows):
            length = unpack(raw, at)[0]
            at += 4
            values[i] = raw[at:at + length].decode()
            at += length
    except struct.error:   # element i's length is not all there: element i - 1 ran past the end, or the data ends
        if at > len(raw):
            raise InvalidArgumentError(f"input {name!r}: element {i - 1} of {length} bytes runs past its data") from None
        raise InvalidArgumentError(f"input {name!r}: its binary BYTES data ends before element {i}") from None
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"input {name!r}: element {i} is not UTF-8 text") from None
    if at > len(raw):
        raise InvalidArgumentError(f"input {name!r}: element {rows - 1} of {length} bytes runs past its data")
    if at != len(raw):
        raise InvalidArgumentError(f"input {name!r}: {len(raw) - at} byte(s) of binary data after its {rows} element(s)")
    return values


def _json_end(body, header_length):
    if header_length is None:
        return len(body)
    try:
        length = int(header_length)
    except ValueError:
        length = -1
    if not 0 < length <= len(body):
        raise InvalidArgumentError(f"{HEADER_LENGTH} must be a number of bytes from 1 to the body's {len(body)}, "
                                   f"got {header_length!r:.40}")
    return length


def _loads(text):
    try:
        request = orjson.loads(text)
    except json.JSONDecodeError as exc:  # orjson's errors are the standard library's, with line and column
        raise InvalidArgumentError(f"malformed JSON in the inference request at line {exc.lineno}, column "
                                   f"{exc.colno}: {exc.msg}") from None
    if not isinstance(request, dict):
        raise InvalidArgumentError(f"the inference request must be a JSON object, got {type(request).__name__}")
    return request


def _parameters(parameters, where):
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidArgumentError(f"{where} parameters must be a JSON object, got {parameters!r:.80}")
    return parameters


def _input_array(tensor, spec, body, offset):
    """(array [n, *spec.shape] of the input's datatype, offset after its binary data) for one request input."""
    name, datatype, shape = spec.name, tensor.get("datatype"), tensor.get("shape")
    count = checked_input(spec, datatype, shape)
    dtype = np.dtype(NUMPY_OF[datatype])
    size = _parameters(tensor.get("parameters"), f"input {name!r}").get("binary_data_size")
    if size is not None:
        if "data" in tensor:
            raise InvalidArgumentError(f"input {name!r} has both \"data\" and binary_data_size")
        if type(size) is not int or size != count * dtype.itemsize:
            raise InvalidArgumentError(f"input {name!r}: binary_data_size must be {count * dtype.itemsize} bytes "
                                       f"({datatype} {shape}), got {size!r:.40}")
        if offset + size > len(body):
            raise InvalidArgumentError(f"input {name!r}: binary_data_size {size} runs past the end of the body "
                                       f"({len(body) - offset} byte(s) left)")
        return np.frombuffer(body, dtype.newbyteorder("<"), count, offset).reshape(shape), offset + size
    data = tensor.get("data")
    if not isinstance(data, list):
        raise InvalidArgumentError(f"input {name!r} needs \"data\" (a list of {count} numbers, row-major) or "
                                   "binary_data_size")
    array = numbers(data, datatype, f"input {name!r}", shape)
    if array.size != count:
        raise InvalidArgumentError(f"input {name!r}: shape {shape} needs {count} values, data holds {array.size}")
    return array.reshape(shape), offset


def checked_input(spec, datatype, shape):
    """The number of values of an input of `spec` (catalog.TensorSpec) sent as `datatype` in `shape` (a list of
    ints, the batch first), or InvalidArgumentError naming what the model takes (REST and gRPC alike)."""
    name = spec.name
    if datatype != spec.datatype:
        raise InvalidArgumentError(f"input {name!r} has datatype {spec.datatype}, got {datatype!r:.40}")
    wanted = f"[n >= 1, {', '.join(map(str, spec.shape))}]"
    if not isinstance(shape, list) or not all(type(d) is int for d in shape) or len(shape) != len(spec.shape) + 1 \
            or tuple(shape[1:]) != spec.shape or shape[0] < 1:
        raise InvalidArgumentError(f"input {name!r} must have shape {wanted}, got {shape!r:.80}")
    return math.prod(shape)


def checked_column(spec, datatype, shape):
    """The number of rows of a raw column of `spec` sent as `datatype` in `shape` ([n] or [n, 1]), or
    InvalidArgumentError: a categorical column is BYTES, a numeric one any number type."""
    name = spec.name
    if not isinstance(shape, list) or not all(type(d) is int for d in shape) or shape[1:] not in ([], [1]) \
            or not shape or shape[0] < 1:
        raise InvalidArgumentError(f"column {name!r} must have shape [n >= 1] or [n, 1], got {shape!r:.80}")
    if spec.datatype == "BYTES":
        if datatype != "BYTES":
            raise InvalidArgumentError(f"column {name!r} is categorical: send it as BYTES (strings), got {datatype!r:.40}")
    elif datatype not in NUMPY_OF or datatype == "BOOL":
        raise InvalidArgumentError(f"column {name!r} is numeric: send it as FP32, FP64 or an integer type, "
                                   f"got {datatype!r:.40}")
    return shape[0]


def numbers(data, datatype, where, shape):
    """`data` (nested lists from JSON) as an array of `datatype`; a value out of its range, a null or
    anything but numbers is the client's error (numpy raised OverflowError for them: a 500 before)."""
    try:
        with np.errstate(over="raise", invalid="raise"):
            array = np.asarray(data, dtype=NUMPY_OF[datatype])
    except (OverflowError, FloatingPointError):
        raise InvalidArgumentError(f"{where}: data holds a number out of the range of {datatype}") from None
    except (TypeError, ValueError):
        raise InvalidArgumentError(f"{where}: data is not a (nested) list of {datatype} numbers in the shape "
                                   f"{shape}") from None
    if array.dtype.kind == "f" and not np.isfinite(array).all():   # JSON has no NaN: a null, or an overflow let by
        raise InvalidArgumentError(f"{where}: data holds a null or a number out of the range of {datatype}")
    return array


def _binary_outputs(outputs, parameters, model, records=False):
    """Which outputs the response carries and whether each is binary (request-wide binary_data_output default).
    Unasked, the model's output; and a classifier's `predicted` too when the request sent raw columns."""
    default = parameters.get("binary_data_output") is True
    if outputs is None:
        return {spec.name: default for spec in (model.outputs if records else model.outputs[:1])}
    if not isinstance(outputs, list):
        raise InvalidArgumentError("\"outputs\" must be a list of {\"name\": ...} objects")
    chosen, names = {}, [spec.name for spec in model.outputs]
    for i, output in enumerate(outputs):
        name = output.get("name") if isinstance(output, dict) else None
        if name not in names:
            raise InvalidArgumentError(f"outputs[{i}]: model {model.name!r} has no output {name!r:.80} "
                                       f"(its outputs: {', '.join(names)})")
        binary = _parameters(output.get("parameters"), f"output {name!r}").get("binary_data", default)
        chosen[name] = binary is True
    return chosen


def requested_outputs(names, model, records=False):
    """The names of the outputs a response carries: `names` (each one of the model's), else the default
    (the model's output; a classifier's `predicted` too for a raw-columns request)."""
    return list(_binary_outputs([{"name": name} for name in names] if names else None, {}, model, records))


def deadline_ms(parameters, header_value):
    """The request's deadline in ms: the X-Zmqflow-Deadline-Ms header, else the `timeout` parameter
    (microseconds, as Triton's clients send it); None when neither is given."""
    if header_value is not None:
        value = int(header_value) if _DIGITS.fullmatch(header_value) else 0
        if not 1 <= value <= MAX_DEADLINE_MS:
            raise InvalidArgumentError(f"{DEADLINE_HEADER} must be a whole number of milliseconds from 1 to "
                                       f"{MAX_DEADLINE_MS}, got {header_value!r:.40}")
        return value
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if type(timeout) is not int or not 1 <= timeout <= MAX_DEADLINE_MS * 1000:
        raise InvalidArgumentError(f"parameter timeout must be a whole number of microseconds from 1 to "
                                   f"{MAX_DEADLINE_MS * 1000}, got {timeout!r:.40}")
    return max(1, math.ceil(timeout / 1000))


_DIGITS = re.compile(r"[0-9]{1,12}")


def encode_infer(model, request, output, parameters):
    """(body bytes, header length or None) of the response to `request`: `output` [n, width] as JSON data or,
    for an output asked as binary, raw little-endian bytes after the JSON header; `predicted` holds each
    row's most probable class name (BYTES)."""
    output = np.ascontiguousarray(output, dtype=np.float32)
    answer = {"model_name": model.name, "model_version": model.version, "parameters": parameters, "outputs": []}
    if request.id is not None:
        answer["id"] = request.id
    binary = []
    for name, as_binary in request.binary_outputs.items():
        if name == model.output.name:
            tensor = {"name": name, "datatype": model.output.datatype, "shape": list(output.shape)}
            values, raw = (None, output.astype("<f4", copy=False).tobytes()) if as_binary else (output.ravel().tolist(), None)
        else:
            names = predicted_classes(model, output)
            tensor = {"name": name, "datatype": "BYTES", "shape": [len(names)]}
            values, raw = (None, bytes_elements(names)) if as_binary else (names, None)
        if as_binary:
            tensor["parameters"] = {"binary_data_size": len(raw)}
            binary.append(raw)
        else:
            tensor["data"] = values
        answer["outputs"].append(tensor)
    header = orjson.dumps(answer)
    if not binary:
        return header, None
    return b"".join([header, *binary]), len(header)


def predicted_classes(model, output):
    """Each row's most probable class name (the `predicted` output) of a classifier's `output` [n, classes]."""
    return [model.classes[i] for i in np.argmax(output, axis=1)]


def bytes_elements(strings):
    """Triton's binary form of a BYTES tensor: each element's UTF-8 length (4 bytes, little-endian), then it."""
    parts = []
    for text in strings:
        data = text.encode()
        parts += [len(data).to_bytes(4, "little"), data]
    return b"".join(parts)


def error_body(message):
    """The protocol's error body: {"error": message}."""
    return json.dumps({"error": str(message)}).encode()
