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


RAW_INFO = {"model": "wine", "schema": {
    "inputs": [{"name": "input", "shape": [5], "dtype": "float32"}],
    "output": {"width": 2, "task": "binary", "classes": ["low", "high"]},
    "features": [{"name": "acid", "type": "numeric", "columns": ["acid"]},
                 {"name": "region", "type": "categorical", "columns": ["region"]}]}}
RAW_MODEL = model_from_info(RAW_INFO, "server", "tcp://127.0.0.1:5700")


def test_a_model_trained_on_a_data_spec_lists_its_raw_columns_and_predicted_classes():
    metadata = RAW_MODEL.metadata()
    assert metadata["raw_inputs"] == [{"name": "acid", "datatype": "FP32", "shape": [-1]},
                                      {"name": "region", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in metadata["outputs"]] == ["probabilities", "predicted"]
    assert "raw_inputs" not in MODEL.metadata() and len(MODEL.metadata()["outputs"]) == 1


def test_raw_columns_become_records_as_json_or_triton_binary():
    request = protocol.parse_infer(body({"name": "region", "shape": [2], "datatype": "BYTES", "data": ["north", "süd"]},
                                        {"name": "acid", "shape": [2, 1], "datatype": "FP64", "data": [[0.5], [1]]}),
                                   None, RAW_MODEL)
    assert request.records == {"region": ["north", "süd"], "acid": [0.5, 1]} and request.inputs == []
    assert request.binary_outputs == {"probabilities": False, "predicted": False}  # raw rows get their classes
    names = protocol.bytes_elements(["north", "süd"])
    acid = np.array([0.5, 1.0], np.float32)
    header = body({"name": "region", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": len(names)}},
                  {"name": "acid", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
                  outputs=[{"name": "predicted", "parameters": {"binary_data": True}}])
    request = protocol.parse_infer(header + names + acid.tobytes(), str(len(header)), RAW_MODEL)
    assert request.records == {"region": ["north", "süd"], "acid": [0.5, 1.0]}
    assert request.binary_outputs == {"predicted": True}


@pytest.mark.parametrize("inputs, message", [
    ([{"name": "acid", "shape": [1], "datatype": "FP32", "data": [1.0]}], "needs raw column\\(s\\) 'region'"),
    ([{"name": "acid", "shape": [1], "datatype": "FP32", "data": [1.0]},
      {"name": "region", "shape": [1], "datatype": "FP32", "data": [2.0]}], "categorical: send it as BYTES"),
    ([{"name": "acid", "shape": [1], "datatype": "BYTES", "data": ["x"]},
      {"name": "region", "shape": [1], "datatype": "BYTES", "data": ["n"]}], "numeric: send it as FP32"),
    ([{"name": "acid", "shape": [1], "datatype": "FP32", "data": ["x"]},
      {"name": "region", "shape": [1], "datatype": "BYTES", "data": ["n"]}], "'x' is not a number"),
    ([{"name": "acid", "shape": [2], "datatype": "FP32", "data": [1.0, 2.0]},
      {"name": "region", "shape": [1], "datatype": "BYTES", "data": ["n"]}], "same number of rows"),
    ([{"name": "acid", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]},
      {"name": "region", "shape": [1], "datatype": "BYTES", "data": ["n"]}], "shape \\[n >= 1\\] or \\[n, 1\\]"),
    ([{"name": "acid", "shape": [1], "datatype": "FP32", "data": [1.0]},
      {"name": "input", "shape": [1, 5], "datatype": "FP32", "data": [0.0] * 5}], "has no input 'acid'.*raw columns"),
])
def test_every_bad_raw_column_is_refused_naming_it(inputs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        protocol.parse_infer(body(*inputs), None, RAW_MODEL)


def test_truncated_binary_strings_are_refused():
    names = protocol.bytes_elements(["north"])[:-1]
    header = body({"name": "region", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": len(names)}},
                  {"name": "acid", "shape": [1], "datatype": "FP32", "data": [1.0]})
    with pytest.raises(InvalidArgumentError, match="element 0 of 5 bytes runs past its data"):
        protocol.parse_infer(header + names, str(len(header)), RAW_MODEL)


def test_predicted_names_each_rows_class_as_json_or_binary():
    output = np.array([[0.9, 0.1], [0.2, 0.8]], np.float32)
    request = protocol.InferRequest(None, [], {}, {"predicted": False, "probabilities": False}, {"acid": [1, 2]})
    answer = json.loads(protocol.encode_infer(RAW_MODEL, request, output, {})[0])
    assert answer["outputs"][0] == {"name": "predicted", "datatype": "BYTES", "shape": [2], "data": ["low", "high"]}
    request.binary_outputs = {"predicted": True}
    content, length = protocol.encode_infer(RAW_MODEL, request, output, {})
    assert content[length:] == protocol.bytes_elements(["low", "high"])
