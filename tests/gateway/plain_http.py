"""Plain HTTP for the gateway tests (http.client, no client library): requests with bounded timeouts."""

import http.client
import json
import urllib.parse
from dataclasses import dataclass


@dataclass
class Answer:
    status: int
    headers: dict
    body: bytes

    def json(self):
        return json.loads(self.body)


def request(url, method="GET", path="/", body=None, headers=None, timeout=10.0):
    parsed = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=timeout)
    try:
        connection.request(method, path, body, headers or {})
        response = connection.getresponse()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def infer_json(url, model, x, name="input", parameters=None, headers=None, timeout=10.0):
    """POST a JSON infer of one FP32 input `x`; the Answer."""
    payload = {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    if parameters:
        payload["parameters"] = parameters
    return request(url, "POST", f"/v2/models/{model}/infer", json.dumps(payload).encode(),
                   {"Content-Type": "application/json", **(headers or {})}, timeout)
