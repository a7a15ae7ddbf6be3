"""Bad input and slow parties at the gateway: each answered with its 4xx/5xx status and the protocol's
{"error": ...} body naming what is wrong, and none holding up the requests of others."""

import json
import signal
import socket
import threading
import time
import urllib.parse

import numpy as np
import pytest

from tests.gateway.plain_http import infer_json, request
from tests.support import wait_for

pytestmark = pytest.mark.service

ROW = np.zeros((1, 784), np.float32)


def post(url, body, headers=None, model="ensemble"):
    return request(url, "POST", f"/v2/models/{model}/infer", body, headers)


def refused(answer, status, *words):
    assert answer.status == status, (answer.status, answer.body)
    message = answer.json()["error"]
    for word in words:
        assert word in message, message
    return message


@pytest.mark.parametrize("body, status, words", [
    (b'{"inputs": [', 400, ["malformed JSON", "line 1, column 13"]),
    (b'[1, 2]', 400, ["must be a JSON object"]),
    (b'{"inputs": [{"name": "pixels", "shape": [1, 784], "datatype": "FP32", "data": []}]}', 400,
     ["no input 'pixels'", "input"]),
    (b'{"inputs": [{"name": "input", "shape": [1, 783], "datatype": "FP32", "data": [0]}]}', 400,
     ["shape [n >= 1, 784]", "[1, 783]"]),
    (b'{"inputs": [{"name": "input", "shape": [1, 784], "datatype": "INT64", "data": [0]}]}', 400,
     ["datatype FP32", "INT64"]),
    (b'{"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [1, 2]}]}', 400,
     ["needs 784 values", "holds 2"]),
    (b'{"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": ["a"]}]}', 400,
     ["not a (nested) list of FP32"]),
    (json.dumps({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [0] * 784}],
                 "outputs": [{"name": "logits"}]}).encode(), 400, ["no output 'logits'", "probabilities"]),
])
def test_malformed_requests_are_400_with_the_reason(topology, body, status, words):
    refused(post(topology.gateway, body), status, *words)


def test_unknown_models_routes_and_methods(topology):
    refused(infer_json(topology.gateway, "nope", ROW), 404, "unknown model 'nope'", "ensemble", "m1")
    refused(request(topology.gateway, path="/v2/models/nope"), 404, "unknown model")
    refused(request(topology.gateway, path="/v1/models"), 404, "Not Found")
    refused(request(topology.gateway, "GET", "/v2/models/ensemble/infer"), 405, "Method Not Allowed")


def test_binary_sizes_that_do_not_add_up(topology):
    header = json.dumps({"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 100}}]}).encode()
    refused(post(topology.gateway, header + bytes(100), {"Inference-Header-Content-Length": str(len(header))}),
            400, "binary_data_size must be 3136 bytes")
    header = header.replace(b"100", b"3136")
    refused(post(topology.gateway, header + bytes(3000), {"Inference-Header-Content-Length": str(len(header))}),
            400, "runs past the end of the body")
    refused(post(topology.gateway, header + bytes(3136), {"Inference-Header-Content-Length": "x"}), 400,
            "Inference-Header-Content-Length")


def connect(url):
    parsed = urllib.parse.urlsplit(url)
    return socket.create_connection((parsed.hostname, parsed.port), timeout=5)


def raw_answer(sock):
    """(status line, JSON error) of the response on a raw socket, read until the gateway closes it."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], json.loads(body)["error"]


def test_bodies_over_the_limit_are_413_by_their_length_and_while_streaming(topology):
    """Refused by Content-Length before a byte of the body is read; a chunked body as soon as it passes the limit."""
    start = time.monotonic()
    with connect(topology.gateway) as sock:
        sock.sendall(b"POST /v2/models/ensemble/infer HTTP/1.1\r\nHost: gateway\r\nContent-Length: 2000001\r\n\r\n")
        status, error = raw_answer(sock)
    assert b" 413 " in status and "2000001 bytes is over the gateway's limit of 2000000 bytes" in error
    early = time.monotonic() - start
    with connect(topology.gateway) as sock:
        sock.sendall(b"POST /v2/models/ensemble/infer HTTP/1.1\r\nHost: gateway\r\nTransfer-Encoding: chunked\r\n\r\n")
        for size in [65536] * 30 + [2_000_001 - 30 * 65536]:  # one byte over the limit, and no end chunk
            sock.sendall(b"%x\r\n" % size + b"x" * size + b"\r\n")
        status, error = raw_answer(sock)
    assert b" 413 " in status and "--max-body-bytes" in error
    print(f"\n413 by Content-Length in {early * 1000:.0f} ms; chunked 413 in {(time.monotonic() - start) * 1000:.0f} ms")


def test_bad_deadlines_and_ensemble_parameters_are_400(topology):
    refused(infer_json(topology.gateway, "ensemble", ROW, headers={"X-Zmqflow-Deadline-Ms": "soon"}), 400,
            "X-Zmqflow-Deadline-Ms")
    refused(infer_json(topology.gateway, "ensemble", ROW, parameters={"timeout": -5}), 400, "microseconds")
    refused(infer_json(topology.gateway, "ensemble", ROW, parameters={"combine": "best"}), 400, "combine")


def test_half_open_and_slow_clients_hold_up_no_one(topology):
    """A client that sends half its headers and stalls, and one that stalls mid-body: others are served at
    once; the first is disconnected after --header-timeout-secs (1 s), the second answered 408 after
    --body-timeout-secs (1 s)."""
    stalled_headers = connect(topology.gateway)
    stalled_headers.sendall(b"POST /v2/models/ensemble/infer HTTP/1.1\r\nHost: gateway\r\nContent-Le")
    stalled_body = connect(topology.gateway)
    stalled_body.sendall(b"POST /v2/models/m1/infer HTTP/1.1\r\nHost: gateway\r\nContent-Length: 5000\r\n\r\n{\"in")
    start = time.monotonic()
    for _ in range(5):
        assert infer_json(topology.gateway, "m1", ROW, timeout=2).status == 200
    served = time.monotonic() - start
    closed = stalled_headers.recv(1024)  # b"" once the gateway closes it (socket timeout 5 s bounds the wait)
    header_gone = time.monotonic() - start
    late_status, late_error = raw_answer(stalled_body)
    print(f"\n5 requests served in {served * 1000:.0f} ms beside two stalled clients; half headers closed after "
          f"{header_gone:.2f} s")
    assert served < 1.0 and closed == b"" and header_gone < 3.0
    assert b" 408 " in late_status and "--body-timeout-secs" in late_error
    stalled_headers.close()
    stalled_body.close()


def test_a_paused_member_past_the_deadline_is_504_and_stalls_nothing_else(topology):
    """m3 SIGSTOPped: an ensemble request that needs all 3 members gets 504 at its 300 ms deadline, naming who
    answered; requests to m1 meanwhile are answered at once."""
    m3 = topology.members["m3"]
    slow = {}

    def wait_for_ensemble():
        started = time.monotonic()
        slow["answer"] = infer_json(topology.gateway, "ensemble", ROW, parameters={"min_members": 3},
                                    headers={"X-Zmqflow-Deadline-Ms": "300"})
        slow["took"] = time.monotonic() - started
    m3.signal_group(signal.SIGSTOP)
    try:
        thread = threading.Thread(target=wait_for_ensemble)
        thread.start()
        start = time.monotonic()
        others = [infer_json(topology.gateway, "m1", ROW, timeout=2).status for _ in range(3)]
        others_took = time.monotonic() - start
        thread.join(5)
        assert not thread.is_alive()
    finally:
        m3.signal_group(signal.SIGCONT)
    print(f"\n504 after {slow['took'] * 1000:.0f} ms (deadline 300 ms); 3 requests to m1 meanwhile in "
          f"{others_took * 1000:.0f} ms")
    message = refused(slow["answer"], 504, "2 of 3 needed members answered", "m3")
    assert "m1" in message and 0.3 <= slow["took"] < 1.5 and others == [200] * 3
    wait_for(lambda: infer_json(topology.gateway, "m3", ROW).status == 200, 5, "m3 to answer again")
    wait_for(lambda: request(topology.gateway, path="/v2/models/m3/ready").status == 200, 5, "m3 ready again")


def test_a_paused_single_server_is_503_after_the_deadline_and_grace(topology):
    """The gateway in front of m1 alone, m1 paused: no answer within 200 ms and its grace -> 503, Retry-After."""
    m1 = topology.members["m1"]
    m1.signal_group(signal.SIGSTOP)
    try:
        start = time.monotonic()
        answer = infer_json(topology.single, "m1", ROW, headers={"X-Zmqflow-Deadline-Ms": "200"})
        took = time.monotonic() - start
    finally:
        m1.signal_group(signal.SIGCONT)
    print(f"\n503 after {took:.2f} s (deadline 0.2 s + grace)")
    refused(answer, 503, "no answer from")
    assert answer.headers["retry-after"] == "1" and took < 3.0
    wait_for(lambda: request(topology.single, path="/v2/health/ready").status == 200, 5, "the gateway ready again")
