"""The gateway's HTTP routes: the Open Inference Protocol's health, metadata and infer endpoints (KServe v2 REST).

Why Starlette (served by uvicorn, server.py): KServe's own Python model server runs on FastAPI, which is
Starlette on uvicorn, so the routing, request and response objects are the ones the protocol's
reference implementation uses; Starlette is a thin, maintained ASGI toolkit (no validation layer
between the bytes and the protocol's own checks, which are protocol.py's), and the ZeroMQ side runs
on the same asyncio loop (common/rpc/asyncio_client.py). Bodies are read in chunks up to --max-body-bytes and within
--body-timeout-secs, so a large or slow body costs bounded memory and no thread; what parsing them costs is
reserved first from --max-inflight-bytes (limits.py). A large body is parsed on a thread, not on the loop,
so that the small requests beside it are answered meanwhile. An unexpected failure is answered with a
generic message and an id, its details going only to the log under that id. The infer requests, nearly all
the load, skip Starlette's routing and middleware (InferFirst): their endpoint is a plain ASGI app.
"""

import asyncio
import json
import logging
import re
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
    """The ASGI app of the protocol's routes over `settings` (GatewaySettings): Starlette's routing, with the infer
    requests taken before it (InferFirst)."""
    endpoint = InferEndpoint(settings)
    routes = [Route("/v2", _server_metadata(settings)),
              Route("/v2/health/live", _live),
              Route("/v2/health/ready", _ready(settings))]
    for prefix in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
        routes += [Route(prefix, _model_metadata(settings)),
                   Route(prefix + "/ready", _model_ready(settings)),
                   Route(prefix + "/infer", endpoint, methods=["POST"])]
    return InferFirst(endpoint, Starlette(routes=routes, lifespan=lifespan,
                                       exception_handlers={HTTPException: _http_error, Exception: _internal_error}))


_INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
"""The infer routes' paths, as Starlette matches them ({name} and {version}: one path segment each)."""


class InferFirst:
    """ASGI: a POST to an infer route goes straight to its endpoint, everything else (other routes, other methods,
    the lifespan) to Starlette.

    Why: Starlette's middleware, routing (a regular expression per route until one matches), Request and the
    body reader's task cost ~100 us of the gateway's CPU an inference on 2 cores, a fifth of the overhead budget
    (issue 26); the endpoint needs none of it. Starlette still routes the same paths to the same endpoint (a request
    with a root path, or a GET, which it answers 405), so the answers are the same whichever way a request comes."""

    def __init__(self, infer, app):
        self.infer, self.app = infer, app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            match = _INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                await self.infer.answer(scope, receive, send, match[1], match[2])
                return
        await self.app(scope, receive, send)


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


class InferEndpoint:
    """POST /v2/models/{name}[/versions/{version}]/infer, as a plain ASGI app (InferFirst's, and Starlette's route's):
    the body read within the limits, reserved from --max-inflight-bytes, parsed, forwarded, the answer encoded; an
    OpError answered with its status, anything else with 500 and an id (as Starlette's error handler would)."""

    def __init__(self, settings):
        self.settings = settings

    async def __call__(self, scope, receive, send):   # Starlette's route: the path's parameters are in the scope
        params = scope["path_params"]
        await self.answer(scope, receive, send, params["name"], params.get("version"))

    async def answer(self, scope, receive, send, name, version):
        settings = self.settings
        started = time.perf_counter()
        try:
            response = await self._infer(scope, receive, name, version)
        except Exception as exc:  # noqa: BLE001  (a bug: answered 500 by its id, the details logged)
            response = _internal_error_response(f"{scope['method']} {scope['path']} failed", exc_info=exc)
        if settings.stats is not None:
            known = name if name in settings.discovery.catalog.models else "(unknown)"  # bounded label set
            settings.stats.observe(known, response.status_code, time.perf_counter() - started)
        await response(scope, receive, send)

    async def _infer(self, scope, receive, name, version):
        settings = self.settings
        reservation = Reservation(settings.inflight)
        try:
            model = settings.discovery.catalog.get(name, version)
            length, header_length, deadline_header = _headers_of(scope)

            def reserve(size):
                reservation.grow(request_cost(size, _json_bytes(header_length, size), model))
            body = await read_body(length, _body_chunks(receive), settings.max_body_bytes, settings.body_timeout_s,
                                   reserve)
            if len(body) > PARSE_ON_THREAD_BYTES:
                parsed = await asyncio.to_thread(protocol.parse_infer, body, header_length, model)
            else:
                parsed = protocol.parse_infer(body, header_length, model)
            del body   # its bytes are the inputs' now (or copied into them): not held twice while waiting
            deadline_ms = protocol.deadline_ms(parsed.parameters, deadline_header)
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


_WANTED_HEADERS = {b"content-length": 0, protocol.HEADER_LENGTH.lower().encode(): 1,
                   protocol.DEADLINE_HEADER.lower().encode(): 2}


def _headers_of(scope):
    """(Content-Length, Inference-Header-Content-Length, X-Zmqflow-Deadline-Ms) of the request, None where absent:
    the first of each, as Starlette's Headers.get reads them (ASGI servers give the names lower-cased)."""
    found = [None, None, None]
    for key, value in scope["headers"]:
        index = _WANTED_HEADERS.get(key)
        if index is not None and found[index] is None:
            found[index] = value.decode("latin-1")
    return found


async def _body_chunks(receive):
    """The request body's chunks as the ASGI server hands them (Starlette's Request.stream, without the Request)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return


def _json_bytes(header_length, body_bytes):
    """How many of a body's bytes are JSON: the Inference-Header-Content-Length, else all (checked when parsed)."""
    return int(header_length) if header_length is not None and header_length.isdigit() else body_bytes


async def read_body(length, chunks, limit, timeout_s, reserve=None):
    """The request body from its `chunks` (an async iterator), refused (BodyTooLargeError) by its Content-Length
    `length` (None: not given) before reading or as soon as more than `limit` bytes arrived, and (BodyTimeoutError)
    when it takes longer than `timeout_s`; `reserve(size)` is called with its Content-Length before reading (else
    with the size so far as it arrives), and refuses it by raising."""
    if length is not None and (not length.isdigit() or int(length) > limit):
        if not length.isdigit():
            raise InvalidArgumentError(f"Content-Length must be a number of bytes, got {length!r:.40}")
        raise BodyTooLargeError(f"the request body of {int(length)} bytes is over the gateway's limit of {limit} "
                                "bytes (--max-body-bytes)")
    reserve = reserve or (lambda size: None)
    if length is not None:
        reserve(int(length))

    async def joined():
        parts, size = [], 0
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError(f"the request body is over the gateway's limit of {limit} bytes "
                                        "(--max-body-bytes)")
            if length is None:
                reserve(size)
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)
    try:
        if _timeout is None:   # Python 3.10: the body is read in a task of its own
            return await asyncio.wait_for(joined(), timeout_s)
        async with _timeout(timeout_s):   # a timer on this task: no task, no loop turn of its own (3.11)
            return await joined()
    except asyncio.TimeoutError:
        raise BodyTimeoutError(f"the request body did not arrive within {timeout_s:g} s (--body-timeout-secs)") from None
    except ClientDisconnect:
        raise UnavailableError("the client went away while sending its body") from None


_timeout = getattr(asyncio, "timeout", None)
