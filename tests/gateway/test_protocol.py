"""The protocol's codecs without a server: requests decoded and checked against a model's metadata, answers
encoded as JSON or binary tensors, deadlines, and the catalog built from model_info answers."""

import json

import numpy as np
import pytest

pytest.importorskip("orjson", reason="the gateway needs the http extra (pip install 'zmqflow[http]')")

from zmqflow.common.errors import InvalidArgumentError, NotFoundError  # noqa: E402
from zmqflow.services.gateway import protocol  # noqa: E402
from zmqflow.services.gateway.catalog import Catalog, model_from_info, unique_names  # noqa: E402

pytestmark = pytest.mark.unit

INFO = {"model": "tab", "version": 7, "schema": {
    "inputs": [{"name": "numeric", "shape": [3], "dtype": "float32"}, {"name": "ids", "shape": [2], "dtype": "int64"}],
    "output": {"width": 4, "task": "multiclass"}}}
MODEL = model_from_info(INFO, "server", "tcp://127.0.0.1:5700")


def body(*inputs, **extra):
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def test_metadata_from_model_info():
    assert MODEL.metadata() == {
        "name": "tab", "versions": ["7"], "platform": "zmqflow_server",
        "inputs": [{"name": "numeric", "datatype": "FP32", "shape": [-1, 3]},
                   {"name": "ids", "datatype": "INT64", "shape": [-1, 2]}],
        "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]}]}
    regression = model_from_info({**INFO, "schema": {**INFO["schema"], "output": {"width": 1, "task": "regression"}}},
                                 "server", "x")
    assert regression.output.name == "predictions"
    assert unique_names(["a", "b", "a", "a"]) == ["a", "b", "a-2", "a-3"]


def test_catalog_lookup_names_what_it_serves():
    catalog = Catalog({"tab": MODEL}, loaded=True)
    assert catalog.get("tab", "7") is MODEL
    with pytest.raises(NotFoundError, match="unknown model 'x'; this gateway serves: tab"):
        catalog.get("x")
    with pytest.raises(NotFoundError, match="no version '3'"):
        catalog.get("tab", "3")


def test_json_inputs_in_any_order_come_back_in_the_models_order():
    request = protocol.parse_infer(body({"name": "ids", "shape": [2, 2], "datatype": "INT64", "data": [[1, 2], [3, 4]]},
                                        {"name": "numeric", "shape": [2, 3], "datatype": "FP32", "data": [0.5] * 6},
                                        id="a"), None, MODEL)
    numeric, ids = request.inputs
    assert numeric.dtype == np.float32 and numeric.shape == (2, 3) and ids.tolist() == [[1, 2], [3, 4]]
    assert request.id == "a" and request.binary_outputs == {"probabilities": False}


def test_binary_inputs_after_the_json_header():
    numeric, ids = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([[5, 6], [7, 8]], np.int64)
    header = body({"name": "numeric", "shape": [2, 3], "datatype": "FP32", "parameters": {"binary_data_size": 24}},
                  {"name": "ids", "shape": [2, 2], "datatype": "INT64", "parameters": {"binary_data_size": 32}},
                  parameters={"binary_data_output": True})
    request = protocol.parse_infer(header + numeric.tobytes() + ids.tobytes(), str(len(header)), MODEL)
    np.testing.assert_array_equal(request.inputs[0], numeric)
    np.testing.assert_array_equal(request.inputs[1], ids)
    assert request.binary_outputs == {"probabilities": True}
    with pytest.raises(InvalidArgumentError, match="4 byte\\(s\\) of binary data that no input"):
        protocol.parse_infer(header + numeric.tobytes() + ids.tobytes() + b"xxxx", str(len(header)), MODEL)


@pytest.mark.parametrize("inputs, message", [
    ([{"name": "numeric", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}], "needs input\\(s\\) 'ids'"),
    ([{"name": "numeric", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
      {"name": "numeric", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}], "given twice"),
    ([{"name": "numeric", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
      {"name": "ids", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 4]}], "same number of rows"),
    ([{"name": "numeric", "shape": [0, 3], "datatype": "FP32", "data": []}], "shape \\[n >= 1, 3\\]"),
    ([{"name": "numeric", "shape": [1, 3], "datatype": "FP32", "data": [[1, 2], [3]]}], "not a \\(nested\\) list"),
    (["numeric"], "inputs\\[0\\] must be an object"),
])
def test_every_bad_input_is_refused_naming_it(inputs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        protocol.parse_infer(body(*inputs), None, MODEL)


def test_malformed_json_names_line_and_column():
    with pytest.raises(InvalidArgumentError, match="line 2, column 5"):
        protocol.parse_infer(b'{"inputs":\n    ]', None, MODEL)


def test_deadlines_from_the_header_or_the_timeout_parameter():
    assert protocol.deadline_ms({}, None) is None
    assert protocol.deadline_ms({"timeout": 2500}, None) == 3       # microseconds, rounded up to ms
    assert protocol.deadline_ms({"timeout": 2500}, "40") == 40      # the header wins
    for bad in ("0", "1.5", "soon"):
        with pytest.raises(InvalidArgumentError, match="X-Zmqflow-Deadline-Ms"):
            protocol.deadline_ms({}, bad)


def test_answers_as_json_and_as_binary():
    output = np.array([[0.25, 0.75, 0, 0]], np.float32)
    request = protocol.InferRequest("r1", [], {}, {"probabilities": False})
    content, length = protocol.encode_infer(MODEL, request, output, {"answered": "m1"})
    answer = json.loads(content)
    assert length is None and answer["id"] == "r1" and answer["parameters"] == {"answered": "m1"}
    assert answer["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [1, 4],
                                  "data": [0.25, 0.75, 0.0, 0.0]}]
    request.binary_outputs = {"probabilities": True}
    content, length = protocol.encode_infer(MODEL, request, output, {})
    assert json.loads(content[:length])["outputs"][0]["parameters"] == {"binary_data_size": 16}
    np.testing.assert_array_equal(np.frombuffer(content[length:], "<f4"), output.ravel())
    assert json.loads(protocol.error_body("bad")) == {"error": "bad"}
