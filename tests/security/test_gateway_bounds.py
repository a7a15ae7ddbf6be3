"""The HTTP gateway attacked over raw HTTP (http.client and sockets, no client library): its memory stays
within --max-body-bytes and --max-inflight-bytes (VmHWM of the real process), too many connections or
bytes in flight are answered 503 and the gateway serves again after, bad values are the protocol's 400
without exception text, and a large binary BYTES column is decoded right and off the event loop.
Real model servers (an MNIST MLP, a tabular model with a categorical column) behind real gateways."""

import http.client
import json
import socket
import threading
import time
import urllib.parse

import numpy as np
import pytest

from zmqflow.bench.serve import write_random_checkpoint
from zmqflow.inputs.data_spec import Table, load_spec, model_inputs
from tests.gateway import plain_http
from tests.support.tabular import CITIES, checkpoint, spec_dict, write_csv

pytest.importorskip("starlette", reason="the gateway needs the http extra (pip install 'zmqflow[http]')")

from zmqflow.services.gateway.protocol import bytes_elements  # noqa: E402  (needs the http extra: orjson)

pytestmark = pytest.mark.service

MiB = 1024 * 1024
ROW = {"inputs": [{"name": "input", "shape": [1, 784], "datatype": "FP32", "data": [0.25] * 784}]}
EXCEPTION_TEXT = ("Error(", "Traceback", "Python int", "too large", "overflow", "out of bounds for", "repr")


@pytest.fixture(scope="module")
def servers(tmp_path_factory, module_processes):
    """An MNIST model server, a tabular one (columns age, size, city), and the local reference of the latter."""
    root = tmp_path_factory.mktemp("gateway-bounds")
    write_random_checkpoint(str(root / "mnist"), 1)
    mnist = module_processes.service("zmqflow.services.serve", ["--checkpoint", str(root / "mnist"), "--backend",
                                                                "numpy", "--max-delay-secs", "0", "--model-name", "m1"])
    write_csv(root / "train.csv", 120, seed=4)
    spec = load_spec(spec_dict(root / "train.csv"))
    model, params = checkpoint(root / "tabular", spec, "mlp", seed=1)
    tabular = module_processes.service("zmqflow.services.serve", [
        "--checkpoint", str(root / "tabular"), "--backend", "numpy", "--max-delay-secs", "0", "--model-name", "t1",
        "--max-message-bytes", str(64 * MiB)])

    def reference(age, size, city):
        table = Table({"age": np.asarray(age, np.float32), "size": np.asarray(size, np.float32),
                       "city": np.array([c.encode() for c in city], dtype=object)}, ["t"], np.zeros((len(age), 2), np.int64))
        return model.predict(params, model_inputs(spec, table))
    return mnist.endpoint, tabular.endpoint, reference


def gateway(module_processes, server, *options):
    process = module_processes.service("zmqflow.services.gateway", ["--serve", server, "--refresh-secs", "0.3", *options],
                                       bind="127.0.0.1:0")
    return process, process.endpoint


def post(url, model, body, headers=None, timeout=60.0):
    return plain_http.request(url, "POST", f"/v2/models/{model}/infer", body,
                              {"Content-Type": "application/json", **(headers or {})}, timeout)


def peak_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024


def refused(answer, status, *words):
    """`answer` is the protocol's error body {"error": text} with `status`, naming `words`, without exception text."""
    assert answer.status == status, (answer.status, answer.body[:300])
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()
    assert list(error) == ["error"] and isinstance(error["error"], str)
    for word in words:
        assert word in error["error"], error
    for word in EXCEPTION_TEXT:
        assert word not in error["error"], error
    return error["error"]


def json_body_of_numbers(nbytes):
    """A valid infer body of about `nbytes` of JSON: rows of 784 numbers written "0.0" (the dearest to parse)."""
    row = "[" + ",".join(["0.0"] * 784) + "]"
    rows = nbytes // (len(row) + 1)
    return (f'{{"inputs":[{{"name":"input","shape":[{rows},784],"datatype":"FP32","data":[' +
            ",".join([row] * rows) + "]}]}").encode()


def test_an_8_mib_json_body_and_concurrent_ones_stay_within_the_memory_bound(servers, module_processes):
    """Defaults: one 8 MiB JSON body grew the gateway by 128 MB; four at once would take 512 MB (the pod's limit),
    now the budget (256 MiB) lets one be parsed at a time, the others answered 503 at once, unread."""
    process, url = gateway(module_processes, servers[0])
    assert post(url, "m1", json.dumps(ROW).encode()).status == 200
    before = peak_mb(process.pid)
    body = json_body_of_numbers(8 * MiB - 200)
    assert len(body) <= 8 * MiB
    answers = [None] * 4

    def send(i):
        answers[i] = post(url, "m1", body)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    statuses = sorted(answer.status for answer in answers)
    assert statuses.count(200) >= 1 and set(statuses) <= {200, 503}, statuses
    for answer in answers:
        if answer.status == 503:
            refused(answer, 503, "--max-inflight-bytes")
            assert answer.headers["retry-after"] == "1"
    growth = peak_mb(process.pid) - before
    assert growth < 200, f"the gateway grew by {growth:.0f} MB for 8 MiB JSON bodies (bound: one at a time, ~130 MB)"
    assert post(url, "m1", json.dumps(ROW).encode()).status == 200


def test_a_body_over_the_limit_is_refused_413_unread(servers, module_processes):
    _, url = gateway(module_processes, servers[0])
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=10) as sock:   # says 8 MiB + 1, sends none
        sock.sendall(f"POST /v2/models/m1/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {8 * MiB + 1}\r\n\r\n".encode())
        answer = b"".join(iter(lambda: sock.recv(4096), b"")).decode()   # to the close it announces
    assert answer.startswith("HTTP/1.1 413 "), answer
    assert "connection: close" in answer and "--max-body-bytes" in answer and "8388608" in answer
    chunked = post(url, "m1", iter([b"[" * MiB] * 8 + [b"[" * 16]))   # chunked, no Content-Length: counted as it comes
    refused(chunked, 413, "--max-body-bytes")
    assert post(url, "m1", json.dumps(ROW).encode()).status == 200


def test_a_body_that_would_go_over_the_inflight_budget_is_refused_503_and_served_after(servers, module_processes):
    """A client that announces a body and stalls holds its reservation; the next request is answered 503 at once,
    and once it has gone the same request is served."""
    _, url = gateway(module_processes, servers[0], "--max-body-bytes", "100000", "--max-inflight-bytes", "3200000",
                     "--body-timeout-secs", "20")
    parsed = urllib.parse.urlsplit(url)
    staller = socket.create_connection((parsed.hostname, parsed.port), timeout=10)
    staller.sendall(b"POST /v2/models/m1/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{")
    time.sleep(0.3)
    started = time.monotonic()
    busy = post(url, "m1", json.dumps(ROW).encode())
    assert time.monotonic() - started < 2.0
    text = refused(busy, 503, "--max-inflight-bytes", "3200000")
    assert busy.headers["retry-after"] == "1", text
    staller.close()
    deadline = time.monotonic() + 5
    while (answer := post(url, "m1", json.dumps(ROW).encode())).status != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert answer.status == 200, answer.body[:200]


def test_connections_over_the_limit_are_refused_503_and_the_gateway_serves_after(servers, module_processes):
    _, url = gateway(module_processes, servers[0], "--max-connections", "50")
    parsed = urllib.parse.urlsplit(url)
    held = [socket.create_connection((parsed.hostname, parsed.port), timeout=10) for _ in range(300)]
    try:
        time.sleep(0.5)
        over = post(url, "m1", json.dumps(ROW).encode(), timeout=10)
        assert over.status == 503, (over.status, over.body[:200])
        assert over.headers["connection"] == "close"
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 5
    while (answer := post(url, "m1", json.dumps(ROW).encode())).status != 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert answer.status == 200 and answer.json()["outputs"][0]["shape"] == [1, 10]


def tensor(datatype, data, shape=None, name="input"):
    return {"inputs": [{"name": name, "shape": shape or [1, 784], "datatype": datatype, "data": data}]}


BAD_TENSORS = [   # (body, words the 400 names)
    (tensor("FP32", [1e39] + [0.0] * 783), ["out of the range of FP32"]),
    (tensor("FP32", [None] * 784), ["null"]),
    (tensor("FP32", [[0.0] * 783]), ["shape [1, 784] needs 784 values, data holds 783"]),
    (tensor("FP32", [0.0] * 784, shape=[1, 10]), ["must have shape [n >= 1, 784]"]),
    (tensor("FP32", [0.0] * 784, shape=[2 ** 62, 784]), ["needs", "values"]),
    ({"inputs": [{"name": ["input"], "shape": [1, 784], "datatype": "FP32", "data": [0] * 784}]}, ["has no input"]),
    ({"inputs": [{"name": {"a": 1}}]}, ["has no input"]),
]


@pytest.mark.parametrize("body, words", BAD_TENSORS, ids=[str(i) for i in range(len(BAD_TENSORS))])
def test_bad_tensor_values_are_the_protocols_400(servers, module_processes, body, words, bad_gateway):
    refused(post(bad_gateway, "m1", json.dumps(body).encode()), 400, *words)


@pytest.fixture(scope="module")
def bad_gateway(servers, module_processes):
    return gateway(module_processes, servers[0])[1]


@pytest.mark.parametrize("value", ["99999999999999999999999", "-5", "0", "nan", "inf", "1e3", "1_000", "0x10", "86400001"])
def test_bad_deadline_headers_are_the_protocols_400(bad_gateway, value):
    refused(post(bad_gateway, "m1", json.dumps(ROW).encode(), {"X-Zmqflow-Deadline-Ms": value}), 400,
            "X-Zmqflow-Deadline-Ms", "86400000")


@pytest.mark.parametrize("value", [2 ** 63 - 1, 86400000001, -1, 1.5])
def test_bad_timeout_parameters_are_the_protocols_400(bad_gateway, value):
    refused(post(bad_gateway, "m1", json.dumps({**ROW, "parameters": {"timeout": value}}).encode()), 400, "timeout")


def test_out_of_range_int64_and_other_integers_are_400(servers, module_processes):
    """The tabular model's numeric columns take any integer type: values past the type's range are refused."""
    _, url = gateway(module_processes, servers[1])
    for datatype, value in (("INT64", 2 ** 63), ("INT64", 2 ** 64 - 1), ("INT8", 300), ("UINT8", -1), ("FP16", 1e6)):
        body = {"inputs": [{"name": "age", "shape": [1], "datatype": datatype, "data": [value]},
                           {"name": "size", "shape": [1], "datatype": "FP32", "data": [0.5]},
                           {"name": "city", "shape": [1], "datatype": "BYTES", "data": ["rome"]}]}
        refused(post(url, "t1", json.dumps(body).encode()), 400, datatype)


def columns_body(age, size, cities):
    """A raw-columns infer body with the city column as Triton's binary BYTES data after the JSON header."""
    raw = bytes_elements(cities)
    header = json.dumps({"inputs": [
        {"name": "age", "shape": [len(age)], "datatype": "FP32", "data": list(age)},
        {"name": "size", "shape": [len(size)], "datatype": "FP32", "data": list(size)},
        {"name": "city", "shape": [len(cities)], "datatype": "BYTES", "parameters": {"binary_data_size": len(raw)}}],
        "outputs": [{"name": "probabilities"}, {"name": "predicted"}]}).encode()
    return header + raw, {"Inference-Header-Content-Length": str(len(header)), "Content-Type": "application/octet-stream"}


def test_a_large_binary_bytes_column_is_decoded_right(servers, module_processes):
    _, url = gateway(module_processes, servers[1], "--max-body-bytes", "4000000", "--max-inflight-bytes", str(128 * MiB))
    rng = np.random.default_rng(3)
    rows = 40000
    age, size = rng.normal(40, 10, rows).round(1).tolist(), rng.normal(size=rows).round(3).tolist()
    cities = [CITIES[i] for i in rng.integers(len(CITIES), size=rows)]
    body, headers = columns_body(age, size, cities)
    assert len(body) > 256 * 1024   # parsed on a thread
    answer = post(url, "t1", body, headers)
    assert answer.status == 200, answer.body[:300]
    outputs = {o["name"]: o for o in answer.json()["outputs"]}
    wanted = servers[2](age, size, cities)
    np.testing.assert_allclose(np.asarray(outputs["probabilities"]["data"]).reshape(rows, -1), wanted, rtol=1e-4, atol=1e-5)


def test_a_large_bytes_column_does_not_hold_up_the_small_requests_beside_it(servers, module_processes):
    """8 MiB of short strings (1.6 M elements), refused after it is decoded (the other columns have 1 row), so all
    the time it takes is the gateway's; meanwhile the health route answers in a fraction of it."""
    _, url = gateway(module_processes, servers[1])
    cities = ["ab"] * (8 * MiB // 6 - 100)
    body, headers = columns_body([40.0], [0.5], cities)
    answer, took = [None], [0.0]

    def big():
        started = time.monotonic()
        answer[0] = post(url, "t1", body, headers)
        took[0] = time.monotonic() - started
    thread = threading.Thread(target=big)
    thread.start()
    latencies = []
    while thread.is_alive():
        started = time.monotonic()
        assert plain_http.request(url, path="/v2/health/live", timeout=10).status == 200
        latencies.append(time.monotonic() - started)
    thread.join()
    refused(answer[0], 400, "same number of rows")
    assert took[0] > 0.25, f"the big request took {took[0]:.2f} s: too little to tell"
    assert max(latencies) < took[0] / 3, (f"a small request waited {max(latencies):.2f} s while the big one took "
                                          f"{took[0]:.2f} s")
