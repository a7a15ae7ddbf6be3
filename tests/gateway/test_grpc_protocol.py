"""The gRPC side's codecs without a server: a ModelInferRequest built by tritonclient's own messages is decoded
by the gateway's (both imported in this one process: the gateway's live in a descriptor pool of their own), its
checks are REST's, the answer mirrors the request (raw or typed), and deadlines take the earlier of the
`timeout` parameter and the call's own."""

import numpy as np
import pytest

pytest.importorskip("grpc", reason="the grpc extra installs grpcio (pip install 'zmqflow[grpc]')")
pytest.importorskip("orjson", reason="the gateway needs the http extra (pip install 'zmqflow[http]')")
service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2", reason="the test extra installs tritonclient[grpc]")

from zmqflow.common.errors import DeadlineExceededError, InvalidArgumentError  # noqa: E402
from zmqflow.services.gateway import grpc_predict_v2_pb2 as pb  # noqa: E402
from zmqflow.services.gateway import grpc_service  # noqa: E402
from zmqflow.services.gateway.catalog import model_from_info  # noqa: E402

pytestmark = pytest.mark.unit

INFO = {"model": "tab", "version": 7, "schema": {
    "inputs": [{"name": "numeric", "shape": [3], "dtype": "float32"}, {"name": "ids", "shape": [2], "dtype": "int64"}],
    "output": {"width": 4, "task": "multiclass", "classes": ["a", "b", "c", "d"]}}}
MODEL = model_from_info(INFO, "server", "tcp://127.0.0.1:5700")
NUMERIC = np.arange(6, dtype=np.float32).reshape(2, 3)
IDS = np.array([[1, -2], [3, 2**40]], np.int64)


def decoded(request):
    """The gateway's view of a request tritonclient's messages built (over the wire: its bytes)."""
    return grpc_service.parse_request(pb.ModelInferRequest.FromString(request.SerializeToString()), MODEL)


def tensor_request(raw):
    request = service_pb2.ModelInferRequest(model_name="tab", id="r1")
    request.parameters["timeout"].int64_param = 5000
    for name, array, datatype in (("numeric", NUMERIC, "FP32"), ("ids", IDS, "INT64")):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if raw:
            request.raw_input_contents.append(array.astype(array.dtype.newbyteorder("<")).tobytes())
        elif datatype == "FP32":
            tensor.contents.fp32_contents.extend(array.ravel().tolist())
        else:
            tensor.contents.int64_contents.extend(array.ravel().tolist())
    request.outputs.add(name="probabilities")
    request.outputs.add(name="predicted")
    return request


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "typed"])
def test_requests_decode_and_answers_mirror_them(raw):
    parsed = decoded(tensor_request(raw))
    np.testing.assert_array_equal(parsed.inputs[0], NUMERIC)
    np.testing.assert_array_equal(parsed.inputs[1], IDS)
    assert parsed.id == "r1" and parsed.parameters == {"timeout": 5000}
    output = np.array([[0.1, 0.7, 0.1, 0.1], [0.5, 0.2, 0.2, 0.1]], np.float32)
    answer = grpc_service.encode_response(MODEL, parsed, output, {"answered": "m1", "answered_count": 1, "ms": 1.5})
    response = service_pb2.ModelInferResponse.FromString(answer.SerializeToString())   # as Triton's client reads it
    assert response.id == "r1" and response.model_version == "7"
    assert response.parameters["answered_count"].int64_param == 1 and response.parameters["ms"].string_param == "1.5"
    probabilities, predicted = response.outputs
    assert (probabilities.datatype, list(probabilities.shape), predicted.datatype) == ("FP32", [2, 4], "BYTES")
    if raw:
        np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<f4").reshape(2, 4), output)
        assert response.raw_output_contents[1] == b"\x01\x00\x00\x00b\x01\x00\x00\x00a"
    else:
        assert not response.raw_output_contents
        np.testing.assert_array_equal(np.float32(probabilities.contents.fp32_contents).reshape(2, 4), output)
        assert list(predicted.contents.bytes_contents) == [b"b", b"a"]


def test_mistakes_are_named_as_over_rest():
    request = tensor_request(raw=True)
    request.raw_input_contents[1] = request.raw_input_contents[1][:-1]
    with pytest.raises(InvalidArgumentError, match="input 'ids': its raw_input_contents must be 32 bytes"):
        decoded(request)
    request = tensor_request(raw=False)
    request.inputs[1].contents.int64_contents[0] = 2**63 - 1
    request.inputs[1].datatype = "INT32"
    with pytest.raises(InvalidArgumentError, match="input 'ids' has datatype INT64, got 'INT32'"):
        decoded(request)
    request = tensor_request(raw=False)
    del request.inputs[1]
    with pytest.raises(InvalidArgumentError, match="model 'tab' needs input\\(s\\) 'ids'"):
        decoded(request)
    request = tensor_request(raw=True)
    del request.raw_input_contents[1]
    with pytest.raises(InvalidArgumentError, match="raw_input_contents holds 1 tensor\\(s\\) for 2 input\\(s\\)"):
        decoded(request)
    request = tensor_request(raw=False)
    request.outputs.add(name="logits")
    with pytest.raises(InvalidArgumentError, match="has no output 'logits' \\(its outputs: probabilities, predicted\\)"):
        decoded(request)


def test_the_deadline_is_the_earlier_of_the_parameter_and_the_call():
    assert grpc_service.call_deadline_ms({}, None) is None
    assert grpc_service.call_deadline_ms({"timeout": 300_000}, None) == 300
    assert grpc_service.call_deadline_ms({"timeout": 300_000}, 0.1) == 100
    assert grpc_service.call_deadline_ms({}, 2.5) == 2500
    assert grpc_service.call_deadline_ms({}, 10**9) == 24 * 3600 * 1000   # capped as REST caps it
    with pytest.raises(DeadlineExceededError):
        grpc_service.call_deadline_ms({}, 0.0)
    with pytest.raises(InvalidArgumentError, match="parameter timeout must be a whole number of microseconds"):
        grpc_service.call_deadline_ms({"timeout": "soon"}, 1.0)
