"""The gateway's gRPC service (--grpc-bind) through `tritonclient.grpc`, and its REST side through
`tritonclient.http` on the same gateways: health, metadata, infer with raw and typed contents against the
ensemble and a member (equal to the ZeroMQ path and to REST), errors with their codes and messages,
deadlines, and the request metrics. Real model servers, aggregator and gateways (tests/gateway/conftest.py)."""

import json
import signal
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.clients.serve import ModelClient
from tests.support import free_port, wait_for

grpc = pytest.importorskip("grpc", reason="the grpc extra installs grpcio (pip install 'zmqflow[grpc]')")
grpcclient = pytest.importorskip("tritonclient.grpc", reason="the test extra installs tritonclient[grpc]")
httpclient = pytest.importorskip("tritonclient.http", reason="the test extra installs tritonclient[http]")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

pytestmark = pytest.mark.service

ROWS = np.random.default_rng(5).random((3, 784), dtype=np.float32)


@pytest.fixture(scope="module")
def client(topology):
    client = grpcclient.InferenceServerClient(topology.grpc)
    yield client
    client.close()


@pytest.fixture(scope="module")
def rest(topology):
    client = httpclient.InferenceServerClient(topology.gateway.removeprefix("http://"), network_timeout=10.0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(topology):
    """The protocol's stub over a plain channel, for requests tritonclient does not build (typed contents)."""
    with grpc.insecure_channel(topology.grpc) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def infer(client, model, rows=ROWS, datatype="FP32", **options):
    data = grpcclient.InferInput("input", list(rows.shape), datatype)
    data.set_data_from_numpy(rows)
    return client.infer(model, [data], outputs=[grpcclient.InferRequestedOutput("probabilities")], **options)


def refused(call, code, *words):
    with pytest.raises(InferenceServerException) as error:
        call()
    assert error.value.status() == str(code), error.value
    for word in words:
        assert word in error.value.message(), error.value.message()
    return error.value.message()


def test_health_and_metadata_over_grpc_and_rest(client, rest):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("ensemble") and client.is_model_ready("m2")
    server = client.get_server_metadata()
    assert server.name == "zmqflow" and list(server.extensions) == rest.get_server_metadata()["extensions"]
    for model in ("ensemble", "m2"):
        metadata, over_rest = client.get_model_metadata(model, as_json=True), rest.get_model_metadata(model)
        assert metadata["inputs"] == [{"name": "input", "datatype": "FP32", "shape": ["-1", "784"]}]  # int64 as JSON
        assert [o["name"] for o in metadata["outputs"]] == [o["name"] for o in over_rest["outputs"]]
        assert (metadata["name"], metadata["versions"], metadata["platform"]) == \
            (over_rest["name"], over_rest["versions"], over_rest["platform"])
    refused(lambda: client.is_model_ready("nope"), "StatusCode.NOT_FOUND", "unknown model 'nope'")
    refused(lambda: client.get_model_metadata("m2", model_version="7"), "StatusCode.NOT_FOUND", "no version '7'")


def health_check(address, service=""):
    """grpc.health.v1.Health/Check as Kubernetes' gRPC probe sends it, its messages written on the wire by hand
    (field 1, the service name; field 1 of the answer, the status: 1 SERVING, 2 NOT_SERVING), so the test does not
    read the gateway's answer with the gateway's own message classes."""
    request = b"\n" + bytes([len(service)]) + service.encode() if service else b""
    with grpc.insecure_channel(address) as channel:
        return channel.unary_unary("/grpc.health.v1.Health/Check")(request, timeout=5)


def test_the_standard_health_service_answers_as_server_ready(topology, processes):
    """What Kubernetes' `grpc:` probe and grpc_health_probe ask: SERVING while the gateway is ready (for the server
    and for the protocol's service), NOT_SERVING while its upstream does not answer, NOT_FOUND for another name;
    Watch is not served (UNIMPLEMENTED: each watcher would hold an RPC for ever)."""
    for address in (topology.grpc, topology.grpc_single):
        assert health_check(address) == b"\x08\x01"
        assert health_check(address, "inference.GRPCInferenceService") == b"\x08\x01"
    with pytest.raises(grpc.RpcError) as error:
        health_check(topology.grpc, "nope")
    assert error.value.code() == grpc.StatusCode.NOT_FOUND and "unknown service 'nope'" in error.value.details()
    with grpc.insecure_channel(topology.grpc) as channel:
        with pytest.raises(grpc.RpcError) as error:
            next(iter(channel.unary_stream("/grpc.health.v1.Health/Watch")(b"", timeout=5)))
    assert error.value.code() == grpc.StatusCode.UNIMPLEMENTED

    grpc_port = free_port()   # a gateway whose model server is not there: up, but not ready
    processes.service("zmqflow.services.gateway", ["--serve", f"tcp://127.0.0.1:{free_port()}", "--grpc-bind",
                                                   str(grpc_port), "--refresh-secs", "0.3"], bind="127.0.0.1:0")
    assert health_check(f"127.0.0.1:{grpc_port}") == b"\x08\x02"
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        assert client.is_server_live() and not client.is_server_ready()


def test_raw_contents_equal_rest_and_the_zeromq_path(client, rest, topology):
    result = infer(client, "ensemble", timeout=2_000_000)   # microseconds, as over REST
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (3, 10) and result.get_response().raw_output_contents
    assert result.get_response().parameters["answered_count"].int64_param == 3
    with AggregatorClient(topology.aggregator.endpoint) as zmq_client:   # the members' mean, in arrival order
        np.testing.assert_allclose(probabilities, zmq_client.predict(ROWS)[0], rtol=1e-6)
    data = httpclient.InferInput("input", list(ROWS.shape), "FP32")
    data.set_data_from_numpy(ROWS, binary_data=True)
    np.testing.assert_allclose(probabilities, rest.infer("ensemble", [data]).as_numpy("probabilities"), rtol=1e-6)

    member = infer(client, "m2").as_numpy("probabilities")
    with ModelClient(topology.members["m2"].endpoint) as zmq_client:
        np.testing.assert_array_equal(member, zmq_client.predict(ROWS)[0])


def test_typed_contents_are_answered_typed(stub, topology):
    request = service_pb2.ModelInferRequest(model_name="m2", id="req-7")
    tensor = request.inputs.add(name="input", datatype="FP32", shape=list(ROWS.shape))
    tensor.contents.fp32_contents.extend(ROWS.ravel().tolist())
    response = stub.ModelInfer(request, timeout=10)
    assert response.id == "req-7" and not response.raw_output_contents
    (output,) = response.outputs
    assert (output.name, output.datatype, list(output.shape)) == ("probabilities", "FP32", [3, 10])
    with ModelClient(topology.members["m2"].endpoint) as zmq_client:
        np.testing.assert_array_equal(np.asarray(output.contents.fp32_contents, np.float32).reshape(3, 10),
                                      zmq_client.predict(ROWS)[0])


def test_errors_carry_their_code_and_message(client, stub):
    refused(lambda: infer(client, "nope"), "StatusCode.NOT_FOUND", "unknown model 'nope'", "ensemble", "m2")
    refused(lambda: infer(client, "m2", ROWS[:, :100]), "StatusCode.INVALID_ARGUMENT",
            "input 'input' must have shape [n >= 1, 784], got [3, 100]")
    refused(lambda: infer(client, "m2", ROWS.astype(np.float64), "FP64"), "StatusCode.INVALID_ARGUMENT",
            "input 'input' has datatype FP32, got 'FP64'")
    request = service_pb2.ModelInferRequest(model_name="m2")
    request.inputs.add(name="input", datatype="FP32", shape=[1, 784]).contents.fp32_contents.extend([0.5] * 700)
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "shape [1, 784] needs 784 values, its contents.fp32_contents holds 700" in error.value.details()
    request.raw_input_contents.append(ROWS[:1].tobytes())
    with pytest.raises(grpc.RpcError) as error:
        stub.ModelInfer(request, timeout=10)
    assert "has both contents and raw_input_contents" in error.value.details()
    # over --max-body-bytes (2,000,000 here, the whole message as the whole body over REST): refused by grpc
    # while it reads it, naming the limit, before any of it is decoded
    big = np.zeros((700, 784), np.float32)
    refused(lambda: infer(client, "m2", big), "StatusCode.RESOURCE_EXHAUSTED", "larger than max", "vs. 2000000)")
    assert infer(client, "m2").as_numpy("probabilities").shape == (3, 10)   # and it goes on serving


def test_deadlines_the_timeout_parameter_and_the_calls_own(client, topology):
    """m3 SIGSTOPped, all 3 members needed (the min_members parameter, passed on as over REST): the `timeout`
    parameter (300 ms) gets the aggregator's answer at its deadline, naming m3; a client timeout of 300 ms is
    DEADLINE_EXCEEDED at it; the single member's gateway answers meanwhile."""
    m3 = topology.members["m3"]
    m3.signal_group(signal.SIGSTOP)
    try:
        started = time.monotonic()
        refused(lambda: infer(client, "ensemble", timeout=300_000, client_timeout=10,
                                parameters={"min_members": 3}), "StatusCode.DEADLINE_EXCEEDED",
                "2 of 3 needed members answered", "m3")
        took_parameter = time.monotonic() - started
        started = time.monotonic()
        refused(lambda: infer(client, "ensemble", client_timeout=0.3, parameters={"min_members": 3}), "StatusCode.DEADLINE_EXCEEDED")
        took_call = time.monotonic() - started
        with grpcclient.InferenceServerClient(topology.grpc_single) as single:
            assert infer(single, "m1", client_timeout=5).as_numpy("probabilities").shape == (3, 10)
    finally:
        m3.signal_group(signal.SIGCONT)
    print(f"\nDEADLINE_EXCEEDED after {took_parameter * 1000:.0f} ms (timeout parameter 300 ms), "
          f"{took_call * 1000:.0f} ms (client timeout 300 ms)")
    assert 0.25 < took_parameter < 2.0 and 0.25 < took_call < 2.0
    wait_for(lambda: _answers(client, "m3"), 5, "m3 to answer again")


def _answers(client, model):
    try:
        return infer(client, model, client_timeout=2).as_numpy("probabilities") is not None
    except InferenceServerException:
        return False


def test_request_metrics_per_model_and_code(topology, processes):
    metrics_port, grpc_port = free_port(), free_port()
    processes.service("zmqflow.services.gateway", ["--aggregator", topology.aggregator.endpoint, "--metrics-bind",
                                                   str(metrics_port), "--grpc-bind", str(grpc_port)],
                      bind="127.0.0.1:0")
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:   # a bare port: loopback
        wait_for(lambda: client.is_model_ready("m2"), 10, "the gateway to know m2")
        infer(client, "m2")
        refused(lambda: infer(client, "no-such-model"), "StatusCode.NOT_FOUND")
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'zmqflow_gateway_grpc_infer_requests_total{code="OK",model="m2",task="gateway"} 1.0' in text
    assert 'zmqflow_gateway_grpc_infer_requests_total{code="NOT_FOUND",model="(unknown)",task="gateway"} 1.0' in text
    assert 'zmqflow_gateway_grpc_infer_duration_seconds_count{model="m2",task="gateway"} 1.0' in text


def test_large_calls_past_the_memory_budget_are_refused_and_the_rest_answered(topology, processes):
    """--max-inflight-bytes bounds gRPC as it bounds REST, from the one budget: a gateway of small limits
    (--max-body-bytes 100 kB, budget 3.2 MB) in front of m3, SIGSTOPped so that what it admits stays in flight.
    Of 16 calls of 88 kB sent at once, each reserves 3x the largest message before grpc reads it, then its own
    cost (3x its raw bytes, 32x the rest: 267 kB): 10 or 11 are admitted, the rest refused RESOURCE_EXHAUSTED
    at once naming the budget; a REST request that would fit an idle gateway is refused 503 meanwhile (the same
    budget); once m3 runs again every admitted call is answered, and the budget is whole again."""
    grpc_port = free_port()
    gateway = processes.service("zmqflow.services.gateway", [
        "--serve", topology.members["m3"].endpoint, "--grpc-bind", str(grpc_port), "--max-body-bytes", "100000",
        "--max-inflight-bytes", "3200000", "--refresh-secs", "60"], bind="127.0.0.1:0")
    rows = np.random.default_rng(6).random((28, 784), dtype=np.float32)   # 87,808 raw bytes
    json_body = json.dumps({"inputs": [{"name": "input", "shape": [2, 784], "datatype": "FP32",
                                        "data": rows[:2].ravel().tolist()}]}).encode()   # 32 x 30 kB: ~1 MB
    results, m3 = [], topology.members["m3"]
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        wait_for(lambda: client.is_model_ready("m3"), 10, "the gateway to know m3")

        def call():
            try:
                results.append(("OK", infer(client, "m3", rows, client_timeout=30).as_numpy("probabilities").shape))
            except InferenceServerException as exc:
                results.append((exc.status(), exc.message()))
        m3.signal_group(signal.SIGSTOP)
        threads = [threading.Thread(target=call) for _ in range(16)]
        try:
            for thread in threads:
                thread.start()
            wait_for(lambda: len(results) >= 16 - 11, 20, "the calls past the budget to be refused")
            time.sleep(0.5)   # any later refusal too
            refusals = list(results)
            with pytest.raises(urllib.error.HTTPError) as error:
                urllib.request.urlopen(urllib.request.Request(f"{gateway.endpoint}/v2/models/m3/infer", json_body),
                                       timeout=10)
            assert error.value.code == 503 and "--max-inflight-bytes" in error.value.read().decode()
        finally:
            m3.signal_group(signal.SIGCONT)
            for thread in threads:
                thread.join(timeout=30)
        print(f"\nadmitted {16 - len(refusals)} of 16 calls of {rows.nbytes} raw bytes; refused: {refusals[0]}")
        assert 5 <= len(refusals) <= 6 and len(results) == 16
        for code, message in refusals:
            assert code == "StatusCode.RESOURCE_EXHAUSTED" and "(--max-inflight-bytes)" in message, message
        assert results[len(refusals):] == [("OK", (28, 10))] * (16 - len(refusals))
        # every reservation ended: the REST request (~1 MB of the 3.2) fits again, as a call does
        assert infer(client, "m3", rows, client_timeout=10).as_numpy("probabilities").shape == (28, 10)
        with urllib.request.urlopen(urllib.request.Request(f"{gateway.endpoint}/v2/models/m3/infer", json_body),
                                    timeout=10) as response:
            assert json.loads(response.read())["outputs"][0]["shape"] == [2, 10]


def test_a_message_that_does_not_arrive_is_refused_at_the_body_timeout(topology, client):
    """A client that opens a ModelInfer and stalls before its message (headers sent, no data) holds its
    reservation until --body-timeout-secs (1 s here), then gets DEADLINE_EXCEEDED naming it, as REST's 408;
    the gateway answers others meanwhile."""
    request = service_pb2.ModelInferRequest(model_name="m2")

    def stalled():
        time.sleep(4)
        yield request
    with grpc.insecure_channel(topology.grpc) as channel:
        call = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=service_pb2.ModelInferRequest.SerializeToString,
                                    response_deserializer=service_pb2.ModelInferResponse.FromString)
        started = time.monotonic()
        future = call.future(stalled(), timeout=10)
        assert infer(client, "m2").as_numpy("probabilities").shape == (3, 10)
        with pytest.raises(grpc.RpcError) as error:
            future.result()
        took = time.monotonic() - started
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, error.value
    assert "did not arrive within 1 s (--body-timeout-secs)" in error.value.details()
    assert 0.9 < took < 3.5, took
