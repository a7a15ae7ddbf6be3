"""A web page cannot talk to a service on 127.0.0.1 (issue 23, item 5): libzmq reads an HTTP POST as a
ZMTP 1.0 peer, which a socket with a ZAP domain refuses before any frame reaches Python. A real POST
(http.client, as curl or a browser sends it) to a broker, a ps and an aggregator (every service is one
Service: a model server's socket is made the same way): no request
reaches the handlers (service stats unchanged), the service keeps serving, and its log says so once."""

import http.client
import json

import pytest

from zmqflow.common.rpc.client import RpcClient
from zmqflow.models.spec import MNIST_MLP
from tests.support import wait_for

pytestmark = pytest.mark.service


def post(endpoint, body=b"x" * 8192):
    """An HTTP POST to a ZeroMQ endpoint, as a web page's fetch() would send it; whatever comes back."""
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=3)
    try:
        conn.request("POST", "/", body=body, headers={"Content-Type": "text/plain"})
        return conn.getresponse().read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


SENT = [0]   # the info requests this module sent


def info(endpoint):
    SENT[0] += 1
    with RpcClient(endpoint) as client:
        return client.call("info", timeout=5)[0]


@pytest.mark.parametrize("module, args", [
    ("zmqflow.services.broker", []),
    ("zmqflow.services.ps", ["--model", json.dumps(MNIST_MLP)]),
    ("zmqflow.services.aggregator", ["--member", "tcp://127.0.0.1:7"]),
])
def test_an_http_post_is_refused_before_any_frame_and_logged_once(module, args, processes):
    service = processes.service(module, args)
    before, sent = info(service.endpoint)["stats"], SENT[0]
    for _ in range(5):
        assert post(service.endpoint) is None                          # no HTTP answer: the connection is dropped
    wait_for(lambda: info(service.endpoint)["stats"]["refused_peers"] >= 1, timeout=5)
    after = info(service.endpoint)["stats"]
    # nothing reached a handler: the only requests counted are this test's own info calls
    assert after["requests"] - before["requests"] == SENT[0] - sent
    assert after["errors"] == before["errors"]
    assert after["bad_requests"] == before["bad_requests"] == 0
    assert service.alive()
    log = service.log()
    assert log.count("refused a peer that is not a ZMTP 3 client") == 1
    assert "Traceback" not in log
