"""`zmqflow status --web`: the cluster's status as a web page, refreshed live.

The page (static/index.html, app.js) polls two JSON endpoints: /api/snapshot (the tables:
view.page_view of the latest snapshot) and /api/history (the curves). Everything it loads is
served from here, uPlot included (package data), so it works on a machine without internet.
Starlette and uvicorn come with the http extra, as for the gateway; the listening socket and
uvicorn's settings are the gateway's (services/gateway/server.py).
"""

import contextlib
import math
import os

from starlette.applications import Starlette
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from zmqflow.jobs.status.view import page_view

STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")


def web_app(poller, start_poller=True):
    """The ASGI app over `poller` (a Poller); its lifespan starts and stops the poller's thread."""

    async def index(request):
        return FileResponse(os.path.join(STATIC_DIR, "index.html"), headers={"Cache-Control": "no-cache"})

    async def api_snapshot(request):
        latest, _ = poller.read()
        view = page_view(latest) if latest is not None else None
        return JSONResponse(_finite({"interval_s": poller.interval, "snapshot": view}))

    async def api_history(request):
        _, series = poller.read()
        return JSONResponse(_finite({"interval_s": poller.interval, **series}))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if start_poller:
            poller.start()
        try:
            yield
        finally:
            if start_poller:
                poller.stop()

    return Starlette(routes=[Route("/", index), Route("/api/snapshot", api_snapshot),
                             Route("/api/history", api_history),
                             Mount("/static", StaticFiles(directory=STATIC_DIR), name="static")],
                     lifespan=lifespan)


def _finite(value):
    """`value` with NaN and infinities as None: JSON has no such numbers (a diverged loss is NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def serve_web(poller, host, port, on_listening=print):
    """Serve the web view on host:port (0: any free port) until SIGINT/SIGTERM; `on_listening(url)` once bound."""
    from zmqflow.services.gateway.server import listening_socket, serve, url_of
    sock = listening_socket(host, port)
    on_listening(url_of(sock))
    serve(web_app(poller), sock)
