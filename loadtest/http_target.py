"""The load test's HTTP side: open-loop infer requests (Open Inference Protocol, JSON tensors) to the gateway.

`run_open_loop` needs `submit()` to return at once and `poll(timeout)` to take in answers; HTTP/1.1
has one request in flight per connection, so `connections` threads each hold a keep-alive
connection and take requests from one queue. A request due while every connection is busy waits
in that queue, and its latency counts from its due time (as over ZeroMQ): a slow gateway shows up
as latency, not as fewer requests. An error status becomes the zmqflow error the gateway mapped
to it (services/gateway/statuses.py), so a 429 counts as shed and a 504 as DeadlineExceededError.
"""

import http.client
import itertools
import json
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np

from zmqflow.loadtest.open_loop import run_open_loop

from zmqflow.common.errors import UNAVAILABLE, InvalidArgumentError, OpError, UnknownError, error_from_code
from zmqflow.services.gateway.statuses import HTTP_STATUS

DEADLINE_HEADER = "X-Zmqflow-Deadline-Ms"
DATATYPES = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "INT8": np.int8, "INT16": np.int16,
             "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8, "BOOL": np.bool_}
_CODE_OF_STATUS = {}
for _code, _status in HTTP_STATUS.items():
    _CODE_OF_STATUS.setdefault(_status, _code)   # the first code of a status: 400 is INVALID_ARGUMENT


def error_of(status, body, retry_after=None):
    """The OpError a status and the protocol's {"error": message} body stand for."""
    try:
        message = json.loads(body).get("error", "")
    except (ValueError, AttributeError):
        message = body[:200].decode("utf-8", "replace")
    details = {"retry_after_ms": float(retry_after) * 1000.0} if retry_after and retry_after.isdigit() else None
    code = _CODE_OF_STATUS.get(status)
    if code is None:
        return UnknownError(f"HTTP {status}: {message}", details)
    return error_from_code(code, f"HTTP {status}: {message}", details)


def split_url(url):
    """(host, port) of an http:// URL; InvalidArgumentError naming it otherwise."""
    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parsed.scheme != "http" or not parsed.hostname:
        raise InvalidArgumentError(f"the gateway URL must be http://HOST[:PORT], got {url!r:.80}")
    return parsed.hostname, parsed.port or 80


def model_metadata(url, model, timeout=5.0):
    """GET /v2/models/{model}: its inputs (name, datatype, shape with -1 rows) and outputs."""
    host, port = split_url(url)
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/v2/models/{model}", timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise error_of(exc.code, exc.read()) from None
    except (urllib.error.URLError, OSError) as exc:
        raise error_from_code(UNAVAILABLE, f"{url}: {getattr(exc, 'reason', exc)}") from None


def random_body(metadata, rows, seed=0):
    """A JSON infer body of `rows` random rows in the model's input signature (its metadata)."""
    rng = np.random.default_rng(seed)
    inputs = []
    for spec in metadata["inputs"]:
        shape = [rows] + [d for d in spec["shape"][1:]]
        dtype = DATATYPES.get(spec["datatype"], np.float32)
        data = rng.random(shape) if np.issubdtype(dtype, np.floating) else np.zeros(shape, dtype)
        inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"],
                       "data": np.asarray(data, dtype).ravel().tolist()})
    return inputs


def data_bodies(metadata, data_spec, split, rows, parameters=None, limit=256):
    """(JSON infer bodies, what they hold): consecutive blocks of `rows` rows of a data spec's split, as the
    raw columns the model lists in its metadata (`raw_inputs`: a model trained on a data spec), as a client
    with a table sends them; at most `limit` distinct bodies, cycled by the caller."""
    from zmqflow.inputs.data_spec import load_spec, load_tables   # only with --data: reading a spec is heavy
    raw = metadata.get("raw_inputs")
    if not raw:
        raise InvalidArgumentError(f"model {metadata.get('name')!r} takes no raw rows over HTTP: it was not trained "
                                   "on a data spec (its inputs: "
                                   f"{', '.join(i['name'] for i in metadata.get('inputs', []))})")
    spec = load_spec(data_spec)
    tables = load_tables(spec)
    if split not in tables:
        raise InvalidArgumentError(f"the data spec has no {split!r} split (it has {', '.join(tables)})")
    table = tables[split]
    missing = [column["name"] for column in raw if column["name"] not in table.columns]
    if missing:
        raise InvalidArgumentError(f"the {split!r} split lacks the model's raw column(s) {', '.join(missing)}")
    bodies = []
    for block in range(min(limit, max(1, len(table) // rows))):
        index = (block * rows + np.arange(rows)) % len(table)
        inputs = [{"name": column["name"], "shape": [rows], "datatype": column["datatype"],
                   "data": _column_data(table.columns[column["name"]][index], column["datatype"])} for column in raw]
        bodies.append(json_body(inputs, parameters))
    return bodies, f"{split} split of {spec.name} ({len(table)} rows) as raw columns"


def _column_data(values, datatype):
    """A column's values as JSON: strings for BYTES, numbers (a missing one as null: the spec's default)."""
    if datatype == "BYTES":
        return [v.decode() if isinstance(v, bytes) else str(v) for v in values]
    return [None if v != v else v for v in np.asarray(values, np.float64).tolist()]


def json_body(inputs, parameters=None):
    body = {"inputs": inputs}
    if parameters:
        body["parameters"] = parameters
    return json.dumps(body).encode()


class Pending:
    """One request: `done` once answered; `result()` is (None, the response's parameters) or raises."""

    __slots__ = ("body", "done", "_value", "_error")

    def __init__(self, body):
        self.body, self.done, self._value, self._error = body, False, None, None

    def result(self):
        if self._error is not None:
            raise self._error
        return None, self._value


class HttpTarget:
    """submit(body)/poll(timeout) for the open loop over `connections` keep-alive connections to `url`."""

    def __init__(self, url, model, deadline_ms, connections=16, timeout_s=30.0):
        self.host, self.port = split_url(url)
        self.path = f"/v2/models/{model}/infer"
        self.headers = {"Content-Type": "application/json", DEADLINE_HEADER: str(deadline_ms)}
        self.timeout_s = timeout_s
        self._todo = queue.SimpleQueue()
        self._answered = threading.Condition()
        self._threads = [threading.Thread(target=self._connection, name=f"http-{i}", daemon=True)
                         for i in range(connections)]
        for thread in self._threads:
            thread.start()

    def submit(self, body):
        pending = Pending(body)
        self._todo.put(pending)
        return pending

    def poll(self, timeout):
        """Wait up to `timeout` s for any answer."""
        with self._answered:
            self._answered.wait(timeout)

    def close(self):
        for _ in self._threads:
            self._todo.put(None)
        for thread in self._threads:
            thread.join(self.timeout_s)

    def _connection(self):
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            while (pending := self._todo.get()) is not None:
                try:
                    pending._value = self._send(connection, pending.body)
                except OpError as exc:
                    pending._error = exc
                except (OSError, http.client.HTTPException) as exc:   # the connection broke: a new one next time
                    connection.close()
                    pending._error = error_from_code(UNAVAILABLE, f"{self.host}:{self.port}: {exc!r}")
                pending.done = True
                with self._answered:
                    self._answered.notify_all()
        finally:
            connection.close()

    def _send(self, connection, body):
        connection.request("POST", self.path, body, self.headers)
        response = connection.getresponse()
        content = response.read()
        if response.status != 200:
            raise error_of(response.status, content, response.getheader("Retry-After"))
        return json.loads(content).get("parameters") or {}


def load_test_http(url, model, rate, duration, deadline_ms, min_members=None, rows=1, connections=16, seed=0,
                   data_spec=None, split="test"):
    """The load test's report (as loadtest/aggregator.py's) for open-loop infers of `model` through the gateway:
    random rows in its input signature, or (`data_spec`) the rows of a split as raw columns."""
    metadata = model_metadata(url, model)
    parameters = {"min_members": min_members} if min_members else None
    if data_spec is not None:
        bodies, source = data_bodies(metadata, data_spec, split, rows, parameters)
    else:
        signature = ", ".join(f"{i['name']} {i['shape']} {i['datatype']}" for i in metadata["inputs"])
        bodies, source = [json_body(random_body(metadata, rows, seed), parameters)], \
            f"random rows of {signature} (JSON tensors)"
    sent = itertools.count()
    target = HttpTarget(url, model, deadline_ms, connections)
    try:
        run = run_open_loop(lambda: target.submit(bodies[next(sent) % len(bodies)]), target.poll, rate, duration)
    finally:
        target.close()
    return {"address": f"{url} model {model}", "rate": rate, "duration_s": duration, "deadline_ms": deadline_ms,
            "rows_per_request": rows, "requests_from": source,
            "overall": run.summary(), "events": run.events,
            "partial_answers": sum(1 for o in run.outcomes if o.info and o.info.get("missing"))}


def wait_ready(url, limit_s, sleep=time.sleep):
    """None once GET /v2/health/ready answers 200 within `limit_s` seconds, else the last reason it did not."""
    host, port = split_url(url)
    deadline, reason = time.monotonic() + limit_s, None
    while True:
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/v2/health/ready", timeout=2.0):
                return None
        except urllib.error.HTTPError as exc:
            reason = f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            reason = str(getattr(exc, "reason", exc))
        if time.monotonic() >= deadline:
            return reason
        sleep(0.5)
