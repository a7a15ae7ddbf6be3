"""The gateway's gRPC service (--grpc-bind) through `tritonclient.grpc`, and its REST side through
`tritonclient.http` on the same gateways: health, metadata, infer with raw and typed contents against the
ensemble and a member (equal to the ZeroMQ path and to REST), errors with their codes and messages,
deadlines, and the request metrics. Real model servers, aggregator and gateways (tests/gateway/conftest.py)."""

import signal
import time
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
    # over --max-body-bytes (2,000,000 here): refused by grpc before any of it is decoded
    big = np.zeros((700, 784), np.float32)
    refused(lambda: infer(client, "m2", big), "StatusCode.RESOURCE_EXHAUSTED", "larger than max")
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
