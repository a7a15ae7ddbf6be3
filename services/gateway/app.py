"""The gateway's HTTP routes: the Open Inference Protocol's health, metadata and infer endpoints (KServe v2 REST).

Why Starlette (served by uvicorn, server.py): KServe's own Python model server runs on FastAPI, which is
Starlette on uvicorn, so the routing, request and response objects are the ones the protocol's
reference implementation uses; Starlette is a thin, maintained ASGI toolkit (no validation layer
between the bytes and the protocol's own checks, which are protocol.py's), and the ZeroMQ side runs
on the same asyncio loop (common/rpc/asyncio_client.py). Bodies are read in chunks up to --max-body-bytes and within
--body-timeout-s, so a large or slow body costs bounded memory and no thread.
"""

import asyncio
import json
import logging
import time
from importlib.metadata import PackageNotFoundError, version

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Route

from zmqflow.common.errors import InvalidArgumentError, OpError, UnavailableError
from zmqflow.services.gateway import protocol
from zmqflow.services.gateway.forward import infer
from zmqflow.services.gateway.statuses import BodyTimeoutError, BodyTooLargeError, http_status

log = logging.getLogger(__name__)

JSON = "application/json"
BINARY = "application/octet-stream"
EXTENSIONS = ["binary_tensor_data"]


class GatewaySettings:
    """What the routes need besides the request: the discovery (catalog) and the upstream sockets, and limits."""

    def __init__(self, discovery, upstreams, max_body_bytes=64 * 1024 * 1024, body_timeout_s=30.0,
                 default_timeout_s=10.0, stats=None):
        self.discovery, self.upstreams = discovery, upstreams
        self.stats = stats   # request_stats.RequestStats with --metrics-port, else None
        self.max_body_bytes = max_body_bytes
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
    """The protocol's error response to an OpError: its HTTP status and {"error": message}."""
    status, headers = http_status(error)
    return Response(protocol.error_body(error), status, headers, media_type=JSON)


def _json(value, status=200):
    return Response(json.dumps(value).encode(), status, media_type=JSON)


async def _http_error(request, exc):  # unknown routes (404) and methods (405), as JSON error bodies
    return Response(protocol.error_body(f"{exc.detail}: {request.method} {request.url.path}"), exc.status_code,
                    dict(exc.headers or {}), media_type=JSON)


async def _internal_error(request, exc):
    log.exception("%s %s failed", request.method, request.url.path)
    return Response(protocol.error_body(f"internal error: {exc!r}"), 500, media_type=JSON)


def _server_metadata(settings):
    try:
        release = version("zmqflow")
    except PackageNotFoundError:
        release = "unknown"

    async def endpoint(request):
        return _json({"name": "zmqflow", "version": release, "extensions": EXTENSIONS})
    return endpoint


async def _live(request):
    return _json({"live": True})


def _ready(settings):
    async def endpoint(request):
        discovery = settings.discovery
        ready = discovery.error is None and any(m.ready for m in discovery.catalog.models.values())
        body = {"ready": ready}
        if not ready:
            body["error"] = discovery.error or "no model is ready"
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
        try:
            model = _model(settings, request)
            body = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
            parsed = protocol.parse_infer(body, request.headers.get(protocol.HEADER_LENGTH), model)
            deadline_ms = protocol.deadline_ms(parsed.parameters, request.headers.get(protocol.DEADLINE_HEADER))
            output, parameters = await infer(settings.upstreams, model, parsed.inputs, deadline_ms,
                                             settings.default_timeout_s, parsed.parameters, parsed.records)
            content, header_length = protocol.encode_infer(model, parsed, output, parameters)
        except OpError as exc:
            return error_response(exc)
        if header_length is None:
            return Response(content, media_type=JSON)
        return Response(content, headers={protocol.HEADER_LENGTH: str(header_length)}, media_type=BINARY)
    return endpoint


async def read_body(request, limit, timeout_s):
    """The request body, refused (BodyTooLargeError) by its Content-Length before reading or as soon as
    more than `limit` bytes arrived, and (BodyTimeoutError) when it takes longer than `timeout_s`."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        if not length.isdigit():
            raise InvalidArgumentError(f"Content-Length must be a number of bytes, got {length!r:.40}")
        raise BodyTooLargeError(f"the request body of {int(length)} bytes is over the gateway's limit of {limit} "
                                "bytes (--max-body-bytes)")

    async def chunks():
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(f"the request body is over the gateway's limit of {limit} bytes "
                                        "(--max-body-bytes)")
            parts.append(chunk)
        return b"".join(parts)
    try:
        return await asyncio.wait_for(chunks(), timeout_s)
    except asyncio.TimeoutError:
        raise BodyTimeoutError(f"the request body did not arrive within {timeout_s:g} s (--body-timeout-s)") from None
    except ClientDisconnect:
        raise UnavailableError("the client went away while sending its body") from None
