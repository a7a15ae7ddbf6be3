"""zmqflow's status codes as HTTP statuses, for the protocol's error responses.

Why a table: every failure, the gateway's own (a body too large, a client too slow) and the upstream's
(gRPC's canonical codes on the wire), must reach an HTTP client as the status a REST client acts on:
4xx for what the client can fix, 429 with Retry-After to back off, 503/504 for what may pass.
"""

from zmqflow.common import errors
from zmqflow.common.errors import InvalidArgumentError

RETRY_AFTER_S = 1


class BodyTooLargeError(InvalidArgumentError):
    """The request body is over the gateway's --max-body-bytes (413)."""


class BodyTimeoutError(InvalidArgumentError):
    """The client did not send its whole body within --body-timeout-secs (408)."""


HTTP_STATUS = {
    errors.INVALID_ARGUMENT: 400, errors.FAILED_PRECONDITION: 400, errors.OUT_OF_RANGE: 400,
    errors.NOT_FOUND: 404, errors.ALREADY_EXISTS: 409, errors.PERMISSION_DENIED: 403, errors.UNAUTHENTICATED: 401,
    errors.RESOURCE_EXHAUSTED: 429, errors.CANCELLED: 499, errors.UNIMPLEMENTED: 501,
    errors.UNAVAILABLE: 503, errors.DEADLINE_EXCEEDED: 504,
}


def http_status(error):
    """(status, extra headers) of an OpError."""
    if isinstance(error, BodyTooLargeError):
        return 413, {"Connection": "close"}
    if isinstance(error, BodyTimeoutError):
        return 408, {"Connection": "close"}
    status = HTTP_STATUS.get(getattr(error, "code", None), 500)
    return status, ({"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else {})
