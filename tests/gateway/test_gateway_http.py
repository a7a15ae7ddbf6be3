"""The gateway over plain HTTP (http.client): every endpoint of the protocol, JSON and binary tensors, the
ensemble and its members, and predictions equal to the ZeroMQ path's for the same rows."""

import http.client
import json
import struct
import time
import urllib.parse

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.clients.serve import ModelClient
from tests.gateway.plain_http import infer_json, request

pytestmark = pytest.mark.service

ROWS = np.random.default_rng(7).random((3, 784), dtype=np.float32)


def test_health_and_server_metadata(topology):
    for url in (topology.gateway, topology.single):
        assert request(url, path="/v2/health/live").json() == {"live": True}
        assert request(url, path="/v2/health/ready").json() == {"ready": True}
        assert "binary_tensor_data" in request(url, path="/v2").json()["extensions"]


def test_model_metadata_of_the_ensemble_its_members_and_a_single_server(topology):
    ensemble = request(topology.gateway, path="/v2/models/ensemble").json()
    assert ensemble["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 784]}]
    assert ensemble["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]
    for name in ("m1", "m2", "m3"):
        member = request(topology.gateway, path=f"/v2/models/{name}").json()
        assert member["name"] == name and member["inputs"] == ensemble["inputs"]
        assert request(topology.gateway, path=f"/v2/models/{name}/ready").json() == {"name": name, "ready": True}
    version = request(topology.gateway, path="/v2/models/m1").json()["versions"][0]
    assert request(topology.gateway, path=f"/v2/models/m1/versions/{version}").status == 200
    assert request(topology.gateway, path="/v2/models/m1/versions/999").status == 404
    assert request(topology.single, path="/v2/models/m1").json()["platform"] == "zmqflow_server"
    assert request(topology.single, path="/v2/models/m2").status == 404  # only m1 behind this one


def test_json_infer_equals_the_zeromq_path(topology):
    answer = infer_json(topology.gateway, "ensemble", ROWS)
    assert answer.status == 200, answer.body
    body = answer.json()
    output = body["outputs"][0]
    assert output["name"] == "probabilities" and output["shape"] == [3, 10] and output["datatype"] == "FP32"
    with AggregatorClient(topology.aggregator.endpoint) as client:
        expected, info = client.predict(ROWS)
    # the mean of the members in their arrival order: equal up to float32 rounding
    np.testing.assert_allclose(np.asarray(output["data"], np.float32).reshape(3, 10), expected, rtol=1e-6)
    assert sorted(body["parameters"]["answered"].split(",")) == ["m1", "m2", "m3"]
    assert body["parameters"]["answered_count"] == 3 and body["parameters"]["missing"] == ""
    for url in (topology.gateway, topology.single):  # a member through the aggregator's gateway, and alone
        member = infer_json(url, "m1", ROWS).json()
        with ModelClient(topology.members["m1"].endpoint) as client:
            expected, _ = client.predict(ROWS)
        np.testing.assert_array_equal(np.asarray(member["outputs"][0]["data"], np.float32).reshape(3, 10), expected)


def test_nested_json_data_and_the_request_id_come_back(topology):
    payload = {"id": "req-42", "inputs": [{"name": "input", "shape": [3, 784], "datatype": "FP32",
                                           "data": ROWS.tolist()}]}
    answer = request(topology.gateway, "POST", "/v2/models/m2/infer", json.dumps(payload).encode())
    assert answer.status == 200 and answer.json()["id"] == "req-42"


def test_binary_tensors_in_and_out(topology):
    header = json.dumps({"inputs": [{"name": "input", "shape": [3, 784], "datatype": "FP32",
                                     "parameters": {"binary_data_size": ROWS.nbytes}}],
                         "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}).encode()
    answer = request(topology.gateway, "POST", "/v2/models/ensemble/infer", header + ROWS.tobytes(),
                     {"Inference-Header-Content-Length": str(len(header)),
                      "Content-Type": "application/octet-stream"})
    assert answer.status == 200, answer.body
    length = int(answer.headers["inference-header-content-length"])
    meta = json.loads(answer.body[:length])
    output = meta["outputs"][0]
    assert output["parameters"]["binary_data_size"] == 3 * 10 * 4 and "data" not in output
    probs = np.frombuffer(answer.body[length:], "<f4").reshape(3, 10)
    with AggregatorClient(topology.aggregator.endpoint) as client:
        np.testing.assert_allclose(probs, client.predict(ROWS)[0], rtol=1e-6)
    assert struct.unpack("<f", answer.body[length:length + 4])[0] == probs[0, 0]


def test_binary_output_for_every_output_by_the_request_parameter(topology):
    answer = infer_json(topology.single, "m1", ROWS[:1], parameters={"binary_data_output": True})
    length = int(answer.headers["inference-header-content-length"])
    assert len(answer.body) == length + 40 and answer.headers["content-type"] == "application/octet-stream"


def test_answers_on_a_keep_alive_connection_are_not_held_back(topology):
    """Each answer after the first on one connection waited 44 ms for the client's delayed ACK (Nagle: the
    listening socket lacked TCP_NODELAY); now each takes about a millisecond."""
    parsed = urllib.parse.urlsplit(topology.gateway)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=5)
    try:
        took = []
        for _ in range(20):
            start = time.perf_counter()
            connection.request("GET", "/v2/health/live")
            assert connection.getresponse().read() == b'{"live": true}'
            took.append((time.perf_counter() - start) * 1000)
    finally:
        connection.close()
    print(f"\nkeep-alive GET /v2/health/live: median {np.median(took):.2f} ms")
    assert np.median(took) < 20
