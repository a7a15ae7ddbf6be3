"""The gateway's HTTP routes: the Open Inference Protocol's health, metadata and infer endpoints (KServe v2 REST).

Why Starlette (served by uvicorn, server.py): KServe's own Python model server runs on FastAPI, which is
Starlette on uvicorn, so the routing, request and response objects are the ones the protocol's
reference implementation uses; Starlette is a thin, maintained ASGI toolkit (no validation layer
between the bytes and the protocol's own checks, which are protocol.py's), and the ZeroMQ side runs
on the same asyncio loop (common/rpc/asyncio_client.py). Bodies are read in chunks up to --max-body-bytes and within
--body-timeout-secs, so a large or slow body costs bounded memory and no thread; what parsing them costs is
reserved first from --max-inflight-bytes (limits.py). A large body is parsed on a thread, not on the loop,
so that the small requests beside it are answered meanwhile. An unexpected failure is answered with a
generic message and an id, its details going only to the log under that id.
"""

import asyncio
import json
import logging
import time
import uuid
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Route

from zmqflow.common.errors import InvalidArgumentError, OpError, UnavailableError
from zmqflow.services.gateway import protocol
from zmqflow.services.gateway.catalog import server_metadata
from zmqflow.services.gateway.forward import infer
from zmqflow.services.gateway.limits import InflightBytes, Reservation, request_cost
from zmqflow.services.gateway.statuses import BodyTimeoutError, BodyTooLargeError, http_status

log = logging.getLogger(__name__)

JSON = "application/json"
BINARY = "application/octet-stream"
PARSE_ON_THREAD_BYTES = 256 * 1024
"""Bodies larger than this are parsed on a thread: a BYTES column of 8 MiB takes 0.3 s, that the loop would wait."""


class GatewaySettings:
    """What the routes need besides the request: the discovery (catalog) and the upstream sockets, and limits."""

    def __init__(self, discovery, upstreams, max_body_bytes=8 * 1024 * 1024, body_timeout_s=30.0,
                 default_timeout_s=10.0, stats=None, max_inflight_bytes=256 * 1024 * 1024):
        self.discovery, self.upstreams = discovery, upstreams
        self.stats = stats   # request_stats.RequestStats with --metrics-bind, else None
        self.max_body_bytes = max_body_bytes
        self.inflight = InflightBytes(max_inflight_bytes)
        self.body_timeout_s = body_timeout_s
        self.default_timeout_s = default_timeout_s


def build_app(settings, lifespan=None):
    """The Starlette app of the protocol's routes over `settings` (GatewaySettings)."""
    routes = [Route("/v2", _server_metadata(settings)),
              Route("/v2/health/live", _live),
              Route("/v2/health/ready", _ready(settings))]
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [Route(prefix, _model_metadata(settings)),
                   Route(prefix + "/ready", _model_ready(settings)),
                   Route(prefix + "/infer", _infer(settings), methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={HTTPException: _http_error, Exception: _internal_error})


def error_response(error):
    """The protocol's error response to an OpError: its HTTP status and {"error": message}; an internal
    error (500, the upstream's or the gateway's own) by its id only."""
    status, headers = http_status(error)
    if status == 500:
        return _internal_error_response(f"upstream internal error: {error}")
    return Response(protocol.error_body(error), status, headers, media_type=JSON)


def _internal_error_response(detail, exc_info=None):
    """500 with a generic message and an id; `detail` (and the traceback) go to the log under that id."""
    error_id = uuid.uuid4().hex[:12]
    log.error("internal error %s: %s", error_id, detail, exc_info=exc_info)
    return Response(protocol.error_body(f"internal error (id {error_id}; the gateway's log has the details)"),
                    500, media_type=JSON)


def _json(value, status=200):
    return Response(json.dumps(value).encode(), status, media_type=JSON)


async def _http_error(request, exc):  # unknown routes (404) and methods (405), as JSON error bodies
    return Response(protocol.error_body(f"{exc.detail}: {request.method} {request.url.path}"), exc.status_code,
                    dict(exc.headers or {}), media_type=JSON)


async def _internal_error(request, exc):
    return _internal_error_response(f"{request.method} {request.url.path} failed", exc_info=exc)


def _server_metadata(settings):
    metadata = server_metadata()

    async def endpoint(request):
        return _json(metadata)
    return endpoint


async def _live(request):
    return _json({"live": True})


def _ready(settings):
    async def endpoint(request):
        ready, why_not = settings.discovery.ready()
        body = {"ready": ready}
        if not ready:
            body["error"] = why_not
        return _json(body, 200 if ready else 503)
    return endpoint


def _model(settings, request):
    params = request.path_params
    return settings.discovery.catalog.get(params["name"], params.get("version"))


def _model_metadata(settings):
    async def endpoint(request):
        try:
            return _json(_model(settings, request).metadata())
        except OpError as exc:
            return error_response(exc)
    return endpoint


def _model_ready(settings):
    async def endpoint(request):
        try:
            model = _model(settings, request)
        except OpError as exc:
            return error_response(exc)
        return _json({"name": model.name, "ready": model.ready}, 200 if model.ready else 503)
    return endpoint


def _infer(settings):
    answer = _answer_infer(settings)
    if settings.stats is None:
        return answer

    async def timed(request):
        started = time.perf_counter()
        response = await answer(request)
        name = request.path_params["name"]   # any name a client sends would grow the label set without bound
        known = name if name in settings.discovery.catalog.models else "(unknown)"
        settings.stats.observe(known, response.status_code, time.perf_counter() - started)
        return response
    return timed


def _answer_infer(settings):
    async def endpoint(request):
        reservation = Reservation(settings.inflight)
        try:
            model = _model(settings, request)
            header_length = request.headers.get(protocol.HEADER_LENGTH)

            def reserve(size):
                reservation.grow(request_cost(size, _json_bytes(header_length, size), model))
            body = await read_body(request, settings.max_body_bytes, settings.body_timeout_s, reserve)
            if len(body) > PARSE_ON_THREAD_BYTES:
                parsed = await asyncio.to_thread(protocol.parse_infer, body, header_length, model)
            else:
                parsed = protocol.parse_infer(body, header_length, model)
            del body   # its bytes are the inputs' now (or copied into them): not held twice while waiting
            deadline_ms = protocol.deadline_ms(parsed.parameters, request.headers.get(protocol.DEADLINE_HEADER))
            output, parameters = await infer(settings.upstreams, model, parsed.inputs, deadline_ms,
                                             settings.default_timeout_s, parsed.parameters, parsed.records)
            content, header_length = protocol.encode_infer(model, parsed, output, parameters)
        except OpError as exc:
            return error_response(exc)
        finally:
            reservation.end()
        if header_length is None:
            return Response(content, media_type=JSON)
        return Response(content, headers={protocol.HEADER_LENGTH: str(header_length)}, media_type=BINARY)
    return endpoint


def _json_bytes(header_length, body_bytes):
    """How many of a body's bytes are JSON: the Inference-Header-Content-Length, else all (checked when parsed)."""
    return int(header_length) if header_length is not None and header_length.isdigit() else body_bytes


async def read_body(request, limit, timeout_s, reserve=None):
    """The request body, refused (BodyTooLargeError) by its Content-Length before reading or as soon as
    more than `limit` bytes arrived, and (BodyTimeoutError) when it takes longer than `timeout_s`;
    `reserve(size)` is called with its Content-Length before reading (else with the size so far as it
    arrives), and refuses it by raising."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        if not length.isdigit():
            raise InvalidArgumentError(f"Content-Length must be a number of bytes, got {length!r:.40}")
        raise BodyTooLargeError(f"the request body of {int(length)} bytes is over the gateway's limit of {limit} "
                                "bytes (--max-body-bytes)")
    reserve = reserve or (lambda size: None)
    if length is not None:
        reserve(int(length))

    async def chunks():
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(f"the request body is over the gateway's limit of {limit} bytes "
                                        "(--max-body-bytes)")
            if length is None:
                reserve(size)
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    try:
        return await asyncio.wait_for(chunks(), timeout_s)
    except asyncio.TimeoutError:
        raise BodyTimeoutError(f"the request body did not arrive within {timeout_s:g} s (--body-timeout-secs)") from None
    except ClientDisconnect:
        raise UnavailableError("the client went away while sending its body") from None
