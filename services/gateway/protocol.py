"""The Open Inference Protocol's infer request and response bodies: JSON tensors and the binary tensor extension.

Why here and not in the HTTP app: decoding and checking a request against a model's metadata, and
encoding the answer, is the protocol's logic, testable without a server. A request body is a JSON
object, or (binary extension) a JSON header of `Inference-Header-Content-Length` bytes followed by
the raw tensors, each input saying its size in `parameters.binary_data_size`. Every mistake is an
InvalidArgumentError that names the input and what was expected, which the app answers with 400.
Bodies are parsed with orjson (the http extra): the standard library's parser took 256 us for one
MNIST row of 784 numbers, a quarter of the gateway's whole overhead budget; orjson takes 21 us.
"""

import json
import math
from dataclasses import dataclass

import numpy as np
import orjson

from zmqflow.common.errors import InvalidArgumentError

HEADER_LENGTH = "Inference-Header-Content-Length"
DEADLINE_HEADER = "X-Zmqflow-Deadline-Ms"

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


def parse_infer(body, header_length, model):
    """The InferRequest in `body` (bytes) for `model` (catalog.ServedModel); `header_length` is the
    Inference-Header-Content-Length header (None: the whole body is JSON)."""
    json_end = _json_end(body, header_length)
    request = _loads(body[:json_end])
    parameters = _parameters(request.get("parameters"), "request")
    specs = {spec.name: spec for spec in model.inputs}
    inputs = request.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidArgumentError(f"the request needs \"inputs\": a list of {len(specs)} tensor(s) "
                                   f"({', '.join(specs)}) for model {model.name!r}")
    arrays, offset = {}, json_end
    for i, tensor in enumerate(inputs):
        if not isinstance(tensor, dict):
            raise InvalidArgumentError(f"inputs[{i}] must be an object with name, shape, datatype and data")
        name = tensor.get("name")
        if name not in specs:
            raise InvalidArgumentError(f"inputs[{i}]: model {model.name!r} has no input {name!r:.80} "
                                       f"(its inputs: {', '.join(specs)})")
        if name in arrays:
            raise InvalidArgumentError(f"inputs[{i}]: input {name!r} is given twice")
        arrays[name], offset = _input_array(tensor, specs[name], body, offset)
    if offset != len(body):
        raise InvalidArgumentError(f"the body holds {len(body) - offset} byte(s) of binary data that no input's "
                                   "binary_data_size accounts for")
    missing = [name for name in specs if name not in arrays]
    if missing:
        raise InvalidArgumentError(f"model {model.name!r} needs input(s) {', '.join(map(repr, missing))}")
    rows = {len(a) for a in arrays.values()}
    if len(rows) != 1:
        raise InvalidArgumentError(f"every input needs the same number of rows (the first dimension), got {sorted(rows)}")
    return InferRequest(request.get("id"), [arrays[name] for name in specs], parameters,
                        _binary_outputs(request.get("outputs"), parameters, model))


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
    if datatype != spec.datatype:
        raise InvalidArgumentError(f"input {name!r} has datatype {spec.datatype}, got {datatype!r:.40}")
    wanted = f"[n >= 1, {', '.join(map(str, spec.shape))}]"
    if not isinstance(shape, list) or not all(type(d) is int for d in shape) or len(shape) != len(spec.shape) + 1 \
            or tuple(shape[1:]) != spec.shape or shape[0] < 1:
        raise InvalidArgumentError(f"input {name!r} must have shape {wanted}, got {shape!r:.80}")
    dtype = np.dtype(NUMPY_OF[datatype])
    count = math.prod(shape)
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
    try:
        array = np.asarray(data, dtype=dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"input {name!r}: data is not a (nested) list of {datatype} numbers: {exc}") from None
    if array.size != count:
        raise InvalidArgumentError(f"input {name!r}: shape {shape} needs {count} values, data holds {array.size}")
    return array.reshape(shape), offset


def _binary_outputs(outputs, parameters, model):
    """Which outputs the response carries and whether each is binary (request-wide binary_data_output default)."""
    default = parameters.get("binary_data_output") is True
    if outputs is None:
        return {model.output.name: default}
    if not isinstance(outputs, list):
        raise InvalidArgumentError("\"outputs\" must be a list of {\"name\": ...} objects")
    chosen = {}
    for i, output in enumerate(outputs):
        name = output.get("name") if isinstance(output, dict) else None
        if name != model.output.name:
            raise InvalidArgumentError(f"outputs[{i}]: model {model.name!r} has no output {name!r:.80} "
                                       f"(its output: {model.output.name})")
        binary = _parameters(output.get("parameters"), f"output {name!r}").get("binary_data", default)
        chosen[name] = binary is True
    return chosen


def deadline_ms(parameters, header_value):
    """The request's deadline in ms: the X-Zmqflow-Deadline-Ms header, else the `timeout` parameter
    (microseconds, as Triton's clients send it); None when neither is given."""
    if header_value is not None:
        try:
            value = int(header_value)
        except ValueError:
            value = 0
        if value < 1:
            raise InvalidArgumentError(f"{DEADLINE_HEADER} must be a whole number of milliseconds >= 1, "
                                       f"got {header_value!r:.40}")
        return value
    timeout = parameters.get("timeout")
    if timeout is None:
        return None
    if type(timeout) is not int or timeout < 1:
        raise InvalidArgumentError(f"parameter timeout must be a whole number of microseconds >= 1, got {timeout!r:.40}")
    return max(1, math.ceil(timeout / 1000))


def encode_infer(model, request, output, parameters):
    """(body bytes, header length or None) of the response to `request`: `output` [n, width] as JSON data or,
    for an output asked as binary, raw little-endian bytes after the JSON header."""
    output = np.ascontiguousarray(output, dtype=np.float32)
    answer = {"model_name": model.name, "model_version": model.version, "parameters": parameters, "outputs": []}
    if request.id is not None:
        answer["id"] = request.id
    binary = []
    for name, as_binary in request.binary_outputs.items():
        tensor = {"name": name, "datatype": model.output.datatype, "shape": list(output.shape)}
        if as_binary:
            raw = output.astype("<f4", copy=False).tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            binary.append(raw)
        else:
            tensor["data"] = output.ravel().tolist()
        answer["outputs"].append(tensor)
    header = orjson.dumps(answer)
    if not binary:
        return header, None
    return b"".join([header, *binary]), len(header)


def error_body(message):
    """The protocol's error body: {"error": message}."""
    return json.dumps({"error": str(message)}).encode()
