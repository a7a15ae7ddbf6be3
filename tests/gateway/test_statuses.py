"""zmqflow's status codes as HTTP statuses: what a REST client can fix (4xx), back off from (429 and 503 with
Retry-After) or wait out (504), and the gateway's own refusals (413, 408) closing the connection."""

import json

import pytest

pytest.importorskip("starlette", reason="the gateway needs the http extra (pip install 'zmqflow[http]')")

from zmqflow.common import errors  # noqa: E402
from zmqflow.services.gateway.app import error_response  # noqa: E402
from zmqflow.services.gateway.statuses import BodyTimeoutError, BodyTooLargeError, http_status  # noqa: E402

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("error, status, headers", [
    (errors.InvalidArgumentError("x"), 400, {}),
    (errors.NotFoundError("x"), 404, {}),
    (errors.ResourceExhaustedError("x"), 429, {"Retry-After": "1"}),
    (errors.UnavailableError("x"), 503, {"Retry-After": "1"}),
    (errors.DeadlineExceededError("x"), 504, {}),
    (errors.InternalError("x"), 500, {}),
    (BodyTooLargeError("x"), 413, {"Connection": "close"}),
    (BodyTimeoutError("x"), 408, {"Connection": "close"}),
])
def test_each_error_has_its_http_status(error, status, headers):
    assert http_status(error) == (status, headers)


def test_the_error_response_is_the_protocols_body():
    response = error_response(errors.ResourceExhaustedError("queue full on tcp://a:1"))
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert json.loads(response.body) == {"error": "queue full on tcp://a:1"}
