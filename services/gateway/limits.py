"""The gateway's memory bound: what the requests in flight may hold together (--max-inflight-bytes).

Why a budget estimated from the body and reserved before it is read: a body's bytes are the least of
what it costs. Parsing JSON makes a Python object of every value (orjson first builds its own tree of
the document): an 8 MiB body of numbers grew the gateway by 128 MB, one of tiny nested objects by 265 MB
(VmHWM of the real process). Binary tensor data is used in place (numpy views of the body), but a raw
column's binary data becomes one Python value per element, as dear as JSON. So each request reserves
JSON_COST times its JSON and binary column data, and RAW_COST times its binary tensor data, from its
Content-Length and Inference-Header-Content-Length headers, and is answered 503 (Retry-After) at once,
unread, when that is over what is left; a body without a Content-Length reserves as it arrives. The
reservation ends with the request, so the peak is bounded whatever the number of connections.

gRPC draws from the same budget (grpc_service.py), but grpc tells nobody a message's size before it has
read all of it: a ModelInfer reserves RECEIVE_COST times --max-body-bytes before its message is read,
and once read, what that message holds and its parsing cost (request_cost) instead.
"""

from zmqflow.common.errors import UnavailableError

JSON_COST = 32
"""Memory per byte of JSON while it is parsed, at worst: 16 for a body of numbers, 33 for one of tiny objects."""

RAW_COST = 2
"""Memory per byte of binary tensor data: the body, and the copy sent to the upstream."""

RECEIVE_COST = 3
"""Memory per byte of a gRPC message while grpc receives it: its own buffer, the bytes it hands to Python,
and the parsed message built from them (the first two are freed once it is parsed)."""


def request_cost(body_bytes, json_bytes, model):
    """Memory a request of `body_bytes`, the first `json_bytes` of them JSON, may need while it is parsed and
    forwarded to `model` (a model with raw columns may get them as binary data: counted as JSON)."""
    json_bytes = min(json_bytes, body_bytes)
    binary_cost = JSON_COST if model.columns else RAW_COST
    return json_bytes * JSON_COST + (body_bytes - json_bytes) * binary_cost


class InflightBytes:
    """The memory the requests in flight hold together, refused beyond `limit` (--max-inflight-bytes)."""

    def __init__(self, limit):
        self.limit, self.used = limit, 0

    def reserve(self, nbytes):
        """Take `nbytes` more, or raise UnavailableError (503, Retry-After) when they are not left."""
        if self.used + nbytes > self.limit:
            raise UnavailableError(f"the gateway is busy: the requests in flight hold {self.used} of its "
                                   f"{self.limit} bytes (--max-inflight-bytes), this one needs {nbytes} more; "
                                   "retry later, or send large tensors as binary data")
        self.used += nbytes

    def release(self, nbytes):
        self.used -= nbytes


class Reservation:
    """One request's share of --max-inflight-bytes: grown as its size becomes known, ended with it."""

    def __init__(self, inflight):
        self.inflight, self.nbytes = inflight, 0

    def grow(self, nbytes):
        if nbytes > self.nbytes:
            self.inflight.reserve(nbytes - self.nbytes)
            self.nbytes = nbytes

    def resize(self, nbytes):
        """Hold `nbytes` from now on: more as grow() takes them, fewer given back to the budget."""
        if nbytes < self.nbytes:
            self.inflight.release(self.nbytes - nbytes)
            self.nbytes = nbytes
        self.grow(nbytes)

    def end(self):
        self.inflight.release(self.nbytes)
        self.nbytes = 0
