"""The infer requests' way past Starlette (app.InferFirst): which requests take it, and that they are answered as
Starlette's route answers them."""

import asyncio
import types

import pytest

pytest.importorskip("starlette", reason="the gateway needs the http extra (pip install 'zmqflow[http]')")

from zmqflow.services.gateway.app import GatewaySettings, InferFirst, build_app  # noqa: E402
from zmqflow.services.gateway.catalog import Catalog  # noqa: E402

pytestmark = pytest.mark.unit


class Recorder:
    """Stands for the endpoint and for Starlette: says who got each request."""

    def __init__(self):
        self.seen = []

    async def answer(self, scope, receive, send, name, version):
        self.seen.append(("endpoint", name, version))

    async def __call__(self, scope, receive, send):
        self.seen.append(("starlette", scope.get("method"), scope.get("path")))


def http(method, path, root_path=""):
    return {"type": "http", "method": method, "path": path, "root_path": root_path, "headers": []}


@pytest.mark.parametrize("scope, taken", [
    (http("POST", "/v2/models/m1/infer"), ("endpoint", "m1", None)),
    (http("POST", "/v2/models/m1/versions/7/infer"), ("endpoint", "m1", "7")),
    (http("GET", "/v2/models/m1/infer"), ("starlette", "GET", "/v2/models/m1/infer")),       # its 405
    (http("POST", "/v2/models/m1/ready"), ("starlette", "POST", "/v2/models/m1/ready")),
    (http("POST", "/v2/models/a/b/infer"), ("starlette", "POST", "/v2/models/a/b/infer")),   # no such route: 404
    (http("POST", "/v2/models/m1/versions/infer"), ("starlette", "POST", "/v2/models/m1/versions/infer")),
    (http("POST", "/v2/models/m1/infer/"), ("starlette", "POST", "/v2/models/m1/infer/")),
    (http("POST", "/api/v2/models/m1/infer", "/api"), ("starlette", "POST", "/api/v2/models/m1/infer")),
    ({"type": "lifespan"}, ("starlette", None, None)),
])
def test_only_a_post_to_an_infer_route_skips_starlette(scope, taken):
    recorder = Recorder()
    asyncio.run(InferFirst(recorder, recorder)(scope, None, None))
    assert recorder.seen == [taken]


def test_an_infer_is_answered_the_same_past_starlette_and_through_it():
    """An unknown model's 404, with its body of one chunk and a Content-Length, both ways."""
    discovery = types.SimpleNamespace(catalog=Catalog(models={}, loaded=True))
    app = build_app(GatewaySettings(discovery, upstreams=None))

    def answer(asgi):
        sent, body = [], [{"type": "http.request", "body": b'{"inputs": []}', "more_body": False}]

        async def receive():
            return body.pop(0) if body else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)
        scope = {**http("POST", "/v2/models/nope/infer"), "headers": [(b"content-length", b"14")],
                 "query_string": b"", "app": asgi}
        asyncio.run(asgi(scope, receive, send))
        return sent
    past, through = answer(app), answer(app.app)   # app.app: Starlette, routing to the same endpoint
    assert past == through
    assert past[0]["status"] == 404 and b"unknown model 'nope'" in past[1]["body"]
