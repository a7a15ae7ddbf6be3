"""The Open Inference Protocol over gRPC: inference.GRPCInferenceService beside the REST routes (--grpc-bind).

Why here, on the REST side's loop: Triton's and KServe's users call the protocol over gRPC as often as
over REST, and the two must answer alike. grpc.aio serves on uvicorn's asyncio loop, so each RPC uses
the REST side's catalog (discovery), upstream sockets, --max-inflight-bytes budget, deadlines and
request stats, and its checks (protocol.py's): a request is an InferRequest whichever way it came.
The protocol's messages are KServe's generated ones (grpc_predict_v2_pb2.py, in a descriptor pool of
their own). A ModelInfer's tensors come as typed `contents` (fp32_contents, bytes_contents, ...) or as
`raw_input_contents` (little-endian bytes, BYTES in Triton's length-prefixed form); the answer mirrors
the request: raw_output_contents to a raw request (Triton's clients always send raw), typed contents
to a typed one. Limits: a message over --max-body-bytes is refused by grpc itself (RESOURCE_EXHAUSTED),
at most --max-connections RPCs run at once (more: RESOURCE_EXHAUSTED), and a ModelInfer draws on the REST
side's --max-inflight-bytes budget (limits.py), the one budget of both: before grpc reads its message it
reserves what receiving the largest one costs, then what its message holds and parsing it costs
(RESOURCE_EXHAUSTED when that is not left), and the message must arrive within --body-timeout-secs
(DEADLINE_EXCEEDED), as a REST body must. grpc reads a unary call's message before its handler runs, so
ModelInfer is served as a client stream of its one message (ReceiveReserved): the same call on the wire.
The call's deadline (the client's timeout) is the request's deadline, upstream included, as the
`timeout` parameter is; the earlier of the two holds. The standard health service, grpc.health.v1.Health,
answers on the same port (grpc_health.py: Kubernetes' gRPC probes ask it).
"""

import asyncio
import contextlib
import logging
import math
import time
import uuid

import grpc
import numpy as np

from zmqflow.common.errors import (INTERNAL, UNKNOWN, DeadlineExceededError, InvalidArgumentError, OpError,
                                   ResourceExhaustedError, UnavailableError)
from zmqflow.services.gateway import grpc_predict_v2_pb2 as pb
from zmqflow.services.gateway import protocol
from zmqflow.services.gateway.catalog import server_metadata
from zmqflow.services.gateway.forward import infer
from zmqflow.services.gateway.grpc_health import add_health_service
from zmqflow.services.gateway.grpc_predict_v2_pb2_grpc import (GRPCInferenceServiceServicer,
                                                               add_GRPCInferenceServiceServicer_to_server)
from zmqflow.services.gateway.limits import RECEIVE_COST, Reservation, request_cost

log = logging.getLogger(__name__)

CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}
"""The InferTensorContents field of each datatype (FP16 and BF16 have none: raw_input_contents only)."""

STATUS = {code.value[0]: code for code in grpc.StatusCode}
"""zmqflow's status codes are gRPC's canonical ones: the number -> grpc.StatusCode."""

STOP_GRACE_S = 2.0

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"


class InferenceService(GRPCInferenceServiceServicer):
    """The protocol's RPCs over `settings` (app.GatewaySettings: the REST side's catalog, sockets and limits).
    RepositoryModelLoad and RepositoryModelUnload stay the generated UNIMPLEMENTED."""

    def __init__(self, settings):
        self.settings = settings
        self.metadata = pb.ServerMetadataResponse(**server_metadata())

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.settings.discovery.ready()[0])

    async def ServerMetadata(self, request, context):
        return self.metadata

    async def ModelReady(self, request, context):
        return await _answer(context, lambda: self._model_ready(request))

    async def ModelMetadata(self, request, context):
        return await _answer(context, lambda: self._model_metadata(request))

    async def ModelInfer(self, requests, context):
        """Its one message from the stream `requests` (ReceiveReserved), read once its memory is reserved."""
        started = time.perf_counter()
        done, named = [], []   # whether the request stats have it; the model it names, once read

        def observe(code):   # before the answer leaves: a scrape after it has this request
            done.append(code)
            stats = self.settings.stats
            if stats is not None:   # any name a client sends would grow the label set without bound
                known = named[0] if named and named[0] in self.settings.discovery.catalog.models else "(unknown)"
                stats.observe_grpc(known, code, time.perf_counter() - started)
        reservation = Reservation(self.settings.inflight)
        try:
            return await _answer(context, lambda: self._infer(requests, context, reservation, named), observe)
        finally:
            reservation.end()
            if not done:   # cancelled: the client went away or its deadline passed
                observe("CANCELLED")

    async def _model_ready(self, request):
        return pb.ModelReadyResponse(ready=self._model(request.name, request.version).ready)

    async def _model_metadata(self, request):
        metadata = self._model(request.name, request.version).metadata()
        tensors = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(name=metadata["name"], versions=metadata["versions"],
                                        platform=metadata["platform"],
                                        inputs=[tensors(**spec) for spec in metadata["inputs"]],
                                        outputs=[tensors(**spec) for spec in metadata["outputs"]])

    def _model(self, name, version):
        return self.settings.discovery.catalog.get(name, version)

    async def _infer(self, requests, context, reservation, named):
        settings = self.settings
        reserve(reservation, RECEIVE_COST * settings.max_body_bytes)   # the largest message, before grpc reads it
        request = await one_message(requests, settings.body_timeout_s)
        named.append(request.model_name)
        model = self._model(request.model_name, request.model_version)
        size = request.ByteSize()
        raw_bytes = sum(len(raw) for raw in request.raw_input_contents)
        # parsing it (typed values cost as JSON's do, their 32x cover the message) and the raw contents the
        # message holds beside the copies that request_cost counts: the largest typed message fits alone
        reserve(reservation, request_cost(size, size - raw_bytes, model) + raw_bytes)
        parsed = parse_request(request, model)
        deadline = call_deadline_ms(parsed.parameters, context.time_remaining())
        output, parameters = await infer(settings.upstreams, model, parsed.inputs, deadline,
                                         settings.default_timeout_s, parsed.parameters, parsed.records)
        return encode_response(model, parsed, output, parameters)


def reserve(reservation, nbytes):
    """Hold `nbytes` of --max-inflight-bytes for a call: RESOURCE_EXHAUSTED (as grpc's own limits answer)
    when they are not left; the REST side answers the same 503 (Retry-After)."""
    try:
        reservation.resize(nbytes)
    except UnavailableError as exc:
        raise ResourceExhaustedError(str(exc)) from None


async def one_message(requests, timeout_s):
    """The request message of a ModelInfer (a unary call: one message on its stream), DEADLINE_EXCEEDED when it
    takes longer than `timeout_s` (--body-timeout-secs) to arrive: a stalled client holds no reservation long."""
    async def first():
        async for request in requests:
            return request
        raise InvalidArgumentError("ModelInfer got no request message")
    try:
        return await asyncio.wait_for(first(), timeout_s)
    except asyncio.TimeoutError:
        raise DeadlineExceededError(f"the request message did not arrive within {timeout_s:g} s "
                                    "(--body-timeout-secs)") from None


class ReceiveReserved(grpc.aio.ServerInterceptor):
    """Serves ModelInfer as a client stream of its one message: grpc reads a unary call's message before its
    handler runs, a stream's when the handler asks, so InferenceService.ModelInfer reserves the memory first.
    The wire does not tell them apart: clients make the same unary call."""

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method != MODEL_INFER:
            return handler
        return grpc.stream_unary_rpc_method_handler(handler.unary_unary, handler.request_deserializer,
                                                    handler.response_serializer)


async def _answer(context, work, observe=None):
    """work()'s answer, or the call aborted with the status of its OpError (INTERNAL: by an id only, the
    details logged under it, as the REST side answers a 500); `observe` hears the status code's name."""
    try:
        answer = await work()
        if observe is not None:
            observe("OK")
        return answer
    except OpError as exc:
        code = STATUS.get(exc.code, grpc.StatusCode.UNKNOWN)
        message = _internal(f"upstream internal error: {exc}") if exc.code in (INTERNAL, UNKNOWN) else str(exc)
    except Exception as exc:   # a bug: the client gets an id, never the exception's text
        code, message = grpc.StatusCode.INTERNAL, _internal("gRPC call failed", exc)
    if observe is not None:
        observe(code.name)
    await context.abort(code, message)


def _internal(detail, exc=None):
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error %s: %s", error_id, detail, exc_info=exc)
    return f"internal error (id {error_id}; the gateway's log has the details)"


def call_deadline_ms(parameters, time_remaining):
    """The request's deadline in ms: the earlier of the `timeout` parameter (microseconds) and the call's own
    deadline (`time_remaining` s, None without one); None when there is neither."""
    deadline = protocol.deadline_ms(parameters, None)
    if time_remaining is None:
        return deadline
    if time_remaining <= 0:
        raise DeadlineExceededError("the call's deadline passed before the gateway forwarded it")
    remaining = min(max(1, math.floor(time_remaining * 1000)), protocol.MAX_DEADLINE_MS)
    return remaining if deadline is None else min(deadline, remaining)


def parameters_of(parameters):
    """{key: bool, int or str} of the protocol's InferParameter map."""
    values = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        values[key] = None if choice is None else getattr(parameter, choice)
    return values


def set_parameters(target, values):
    """Fill the InferParameter map `target` from {key: value}: a bool, an int, anything else as its text."""
    for key, value in values.items():
        if isinstance(value, bool):
            target[key].bool_param = value
        elif isinstance(value, int):
            target[key].int64_param = value
        else:
            target[key].string_param = str(value)


def parse_request(request, model):
    """The protocol.InferRequest of a ModelInferRequest for `model` (catalog.ServedModel), checked as the REST
    side checks a body: tensors of the model's inputs, or the raw columns of a model trained on a data spec."""
    parameters = parameters_of(request.parameters)
    tensors, raw = list(request.inputs), list(request.raw_input_contents)
    specs = {spec.name: spec for spec in model.inputs}
    if not tensors:
        raise InvalidArgumentError(f"the request needs inputs: {len(specs)} tensor(s) ({', '.join(specs)}) for "
                                   f"model {model.name!r}")
    if raw and len(raw) != len(tensors):
        raise InvalidArgumentError(f"raw_input_contents holds {len(raw)} tensor(s) for {len(tensors)} input(s): give "
                                   "one per input, in the inputs' order, or none (typed contents)")
    if protocol.raw_columns([{"name": tensor.name} for tensor in tensors], model):
        records = _columns(tensors, raw, model)
        return protocol.InferRequest(request.id or None, [], parameters, _outputs(request, model, raw, True), records)
    arrays = {}
    for i, tensor in enumerate(tensors):
        name = protocol.checked_name(i, tensor.name, specs, arrays, model)
        arrays[name] = _input_array(tensor, specs[name], raw[i] if raw else None)
    protocol.check_complete(arrays, specs, 0, f"model {model.name!r} needs input(s)", "")
    return protocol.InferRequest(request.id or None, [arrays[name] for name in specs], parameters,
                                 _outputs(request, model, raw, False))


def _outputs(request, model, raw, records):
    """{output name: whether it is answered in raw_output_contents} (as the request sent its inputs)."""
    names = protocol.requested_outputs([output.name for output in request.outputs], model, records)
    return {name: bool(raw) for name in names}


def _input_array(tensor, spec, raw):
    """The array [n, *spec.shape] of one model input, from its raw bytes or its typed contents."""
    name, datatype, shape = spec.name, tensor.datatype, list(tensor.shape)
    count = protocol.checked_input(spec, datatype, shape)
    if raw is not None:
        _only_raw(tensor)
        dtype = np.dtype(protocol.NUMPY_OF[datatype]).newbyteorder("<")
        if len(raw) != count * dtype.itemsize:
            raise InvalidArgumentError(f"input {name!r}: its raw_input_contents must be {count * dtype.itemsize} "
                                       f"bytes ({datatype} {shape}), got {len(raw)}")
        return np.frombuffer(raw, dtype, count).reshape(shape)
    values = _typed_values(tensor, name, count, shape)
    return protocol.numbers(values, datatype, f"input {name!r}", shape).reshape(shape)


def _columns(tensors, raw, model):
    """{column: [values]} of a raw-columns request, each column [n] or [n, 1]: BYTES strings or numbers."""
    specs = {spec.name: spec for spec in model.columns}
    records = {}
    for i, tensor in enumerate(tensors):
        name, datatype, shape = tensor.name, tensor.datatype, list(tensor.shape)
        if name in records:
            raise InvalidArgumentError(f"column {name!r} is given twice")
        rows = protocol.checked_column(specs[name], datatype, shape)
        if raw:
            _only_raw(tensor)
            if datatype == "BYTES":
                records[name] = protocol.decode_bytes_elements(raw[i], rows, name)
                continue
            dtype = np.dtype(protocol.NUMPY_OF[datatype]).newbyteorder("<")
            if len(raw[i]) != rows * dtype.itemsize:
                raise InvalidArgumentError(f"input {name!r}: its raw_input_contents must be {rows * dtype.itemsize} "
                                           f"bytes ({datatype} {shape}), got {len(raw[i])}")
            records[name] = np.frombuffer(raw[i], dtype).tolist()
            continue
        values = _typed_values(tensor, name, rows, shape)
        if datatype == "BYTES":
            try:
                records[name] = [value.decode() for value in values]
            except UnicodeDecodeError:
                raise InvalidArgumentError(f"column {name!r}: a value of its bytes_contents is not UTF-8 text") from None
        else:
            records[name] = protocol.numbers(values, datatype, f"column {name!r}", shape).tolist()
    protocol.check_complete(records, specs, 0, f"model {model.name!r} needs raw column(s)",
                            f" (its raw columns: {', '.join(specs)})")
    return records


def _only_raw(tensor):
    if tensor.HasField("contents"):
        raise InvalidArgumentError(f"input {tensor.name!r} has both contents and raw_input_contents: give one")


def _typed_values(tensor, name, count, shape):
    """The `count` values of a tensor's typed contents, as a list."""
    field = CONTENTS.get(tensor.datatype)
    if field is None:
        raise InvalidArgumentError(f"input {name!r}: datatype {tensor.datatype} has no typed contents in the "
                                   "protocol: send it in raw_input_contents")
    values = list(getattr(tensor.contents, field))
    if len(values) != count:
        raise InvalidArgumentError(f"input {name!r}: shape {shape} needs {count} values, its contents.{field} "
                                   f"holds {len(values)} (or send raw_input_contents)")
    return values


def encode_response(model, request, output, parameters):
    """The ModelInferResponse of `output` [n, width] to `request` (protocol.InferRequest): each output asked
    for, raw (little-endian bytes; BYTES length-prefixed) or typed as the request's inputs were."""
    output = np.ascontiguousarray(output, dtype=np.float32)
    response = pb.ModelInferResponse(model_name=model.name, model_version=model.version, id=request.id or "")
    set_parameters(response.parameters, parameters)
    for name, raw in request.binary_outputs.items():
        tensor = response.outputs.add(name=name)
        if name == model.output.name:
            tensor.datatype = model.output.datatype
            tensor.shape.extend(output.shape)
            if raw:
                response.raw_output_contents.append(output.astype("<f4", copy=False).tobytes())
            else:
                tensor.contents.fp32_contents.extend(output.ravel().tolist())
        else:
            names = protocol.predicted_classes(model, output)
            tensor.datatype = "BYTES"
            tensor.shape.append(len(names))
            if raw:
                response.raw_output_contents.append(protocol.bytes_elements(names))
            else:
                tensor.contents.bytes_contents.extend(name.encode() for name in names)
    return response


def grpc_address(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextlib.asynccontextmanager
async def serving(settings, host, port, max_rpcs=1000, idle_s=5.0):
    """The protocol's gRPC service and the health service on host:port (port 0: any free one) while in the
    block, which gets the address it listens on; `max_rpcs` run at once (--max-connections), connections idle
    for `idle_s` close, a ModelInfer reserves its memory before its message is read (ReceiveReserved)."""
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", settings.max_body_bytes),
                                      ("grpc.so_reuseport", 0),   # else a second gateway would share the port
                                      ("grpc.max_connection_idle_ms", int(idle_s * 1000)),
                                      # else grpc widens each stream's window to what the link carries and
                                      # reads messages no handler has asked for: 64 calls of 8 MiB grew the
                                      # gateway by 585 MB with the reservation below, 309-323 MB without it
                                      ("grpc.http2.bdp_probe", 0)],
                             maximum_concurrent_rpcs=max_rpcs, interceptors=[ReceiveReserved()])
    add_GRPCInferenceServiceServicer_to_server(InferenceService(settings), server)
    add_health_service(server, lambda: settings.discovery.ready()[0])
    try:
        bound = server.add_insecure_port(grpc_address(host, port))
    except RuntimeError as exc:
        raise InvalidArgumentError(f"cannot serve gRPC on {grpc_address(host, port)}: {exc}") from None
    await server.start()
    try:
        yield grpc_address(host, bound)
    finally:
        await server.stop(STOP_GRACE_S)
