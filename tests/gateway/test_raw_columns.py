"""Raw rows over HTTP: a model trained on a data spec takes its feature columns as protocol inputs (one per
column, BYTES for a categorical one), made into the model's inputs by the model servers with the statistics
of training, and answers each row's class name as the `predicted` output; through plain HTTP and through
`tritonclient.http` (binary strings), to a member and to the ensemble. Real servers, aggregator and gateway."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from zmqflow.inputs.data_spec import Table, load_spec, model_inputs
from tests.gateway import plain_http
from tests.support import free_port
from tests.support.tabular import checkpoint, spec_dict, write_csv

pytest.importorskip("starlette", reason="the gateway needs the http extra (pip install 'zmqflow[http]')")

pytestmark = pytest.mark.service

ROWS = {"age": [55.0, 25.5, 40.0], "size": [0.1, -1.0, 2.0], "city": ["rome", "oslo", "lisbon"]}
CLASSES = ["cat", "dog"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, module_processes):
    root = tmp_path_factory.mktemp("raw-columns")
    write_csv(root / "train.csv", 120, seed=4)
    local, members = {}, []
    for seed, (name, model_spec) in enumerate((("mlp", "mlp"), ("logistic", "logistic")), start=1):
        spec = load_spec(spec_dict(root / "train.csv"))
        model, params = checkpoint(root / name, spec, model_spec, seed=seed)
        table = Table({"age": np.array(ROWS["age"], np.float32), "size": np.array(ROWS["size"], np.float32),
                       "city": np.array([c.encode() for c in ROWS["city"]], dtype=object)},
                      ["t"], np.zeros((3, 2), np.int64))
        local[name] = model.predict(params, model_inputs(spec, table))
        members.append(module_processes.service("zmqflow.services.serve", [
            "--checkpoint", str(root / name), "--backend", "numpy", "--max-delay-secs", "0.001", "--model-name", name]))
    aggregator = module_processes.service("zmqflow.services.aggregator", [
        *[a for m in members for a in ("--member", m.endpoint)], "--deadline-ms", "3000"])
    grpc = f"127.0.0.1:{free_port()}" if importlib.util.find_spec("grpc") else None
    gateway = module_processes.service("zmqflow.services.gateway", [
        "--aggregator", aggregator.endpoint, "--refresh-secs", "0.3", *(["--grpc-bind", grpc] if grpc else [])],
        bind="127.0.0.1:0")
    wait_ready(gateway.endpoint, ("ensemble", "mlp", "logistic"))
    (root / "spec.yaml").write_text(json.dumps(spec_dict(root / "train.csv")))
    return gateway.endpoint, local, root / "spec.yaml", grpc


def wait_ready(url, models, timeout_s=15.0):
    import time
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(plain_http.request(url, path=f"/v2/models/{m}/ready", timeout=2.0).status == 200 for m in models):
            return
        time.sleep(0.1)
    raise AssertionError(f"models {models} not ready at {url} within {timeout_s} s")


def columns_request(rows, **extra):
    inputs = [{"name": name, "shape": [len(values)], "datatype": "BYTES" if name == "city" else "FP32",
               "data": values} for name, values in rows.items()]
    return {"inputs": inputs, **extra}


def infer(url, model, payload):
    return plain_http.request(url, "POST", f"/v2/models/{model}/infer", json.dumps(payload).encode(),
                              {"Content-Type": "application/json"})


def outputs_of(answer):
    return {o["name"]: o for o in answer.json()["outputs"]}


def test_metadata_lists_the_raw_columns_and_the_predicted_output(cluster):
    url, _, _, _ = cluster
    metadata = plain_http.request(url, path="/v2/models/mlp").json()
    assert metadata["raw_inputs"] == [{"name": "age", "datatype": "FP32", "shape": [-1]},
                                      {"name": "size", "datatype": "FP32", "shape": [-1]},
                                      {"name": "city", "datatype": "BYTES", "shape": [-1]}]
    assert [o["name"] for o in metadata["outputs"]] == ["probabilities", "predicted"]


def test_plain_http_raw_rows_get_the_models_answer_and_each_rows_class(cluster):
    url, local, _, _ = cluster
    answer = infer(url, "mlp", columns_request(ROWS))
    assert answer.status == 200, answer.body
    outputs = outputs_of(answer)
    probabilities = np.array(outputs["probabilities"]["data"], np.float32).reshape(outputs["probabilities"]["shape"])
    np.testing.assert_allclose(probabilities, local["mlp"], rtol=1e-5, atol=1e-6)
    assert outputs["predicted"]["data"] == [CLASSES[i] for i in np.argmax(local["mlp"], axis=1)]


def test_the_ensemble_takes_raw_rows_and_names_the_combined_class(cluster):
    url, local, _, _ = cluster
    answer = infer(url, "ensemble", columns_request(ROWS, outputs=[{"name": "predicted"}]))
    assert answer.status == 200, answer.body
    mean = (local["mlp"] + local["logistic"]) / 2
    assert [o["name"] for o in answer.json()["outputs"]] == ["predicted"]
    assert outputs_of(answer)["predicted"]["data"] == [CLASSES[i] for i in np.argmax(mean, axis=1)]
    assert answer.json()["parameters"]["answered_count"] == 2


def test_tritonclient_sends_raw_columns_as_binary_strings(cluster):
    httpclient = pytest.importorskip("tritonclient.http", reason="the test extra installs tritonclient[http]")
    url, local, _, _ = cluster
    client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=10.0)
    try:
        inputs = []
        for name, values in ROWS.items():
            array = np.array(values, dtype=object if name == "city" else np.float32)
            tensor = httpclient.InferInput(name, [len(values)], "BYTES" if name == "city" else "FP32")
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("probabilities", "predicted")]
        result = client.infer("ensemble", inputs, outputs=wanted)
    finally:
        client.close()
    mean = (local["mlp"] + local["logistic"]) / 2
    np.testing.assert_allclose(result.as_numpy("probabilities"), mean, rtol=1e-5, atol=1e-6)
    assert [v.decode() for v in result.as_numpy("predicted")] == [CLASSES[i] for i in np.argmax(mean, axis=1)]


def test_raw_columns_over_grpc_raw_and_typed(cluster):
    """tritonclient.grpc sends the columns as raw_input_contents (BYTES length-prefixed); typed contents
    (bytes_contents, fp32_contents) get typed outputs; a mistyped column is INVALID_ARGUMENT naming it."""
    grpc = pytest.importorskip("grpc", reason="the grpc extra installs grpcio")
    grpcclient = pytest.importorskip("tritonclient.grpc", reason="the test extra installs tritonclient[grpc]")
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    _, local, _, address = cluster
    mean = (local["mlp"] + local["logistic"]) / 2
    classes = [CLASSES[i] for i in np.argmax(mean, axis=1)]
    with grpcclient.InferenceServerClient(address) as client:
        inputs = []
        for name, values in ROWS.items():
            tensor = grpcclient.InferInput(name, [len(values)], "BYTES" if name == "city" else "FP32")
            tensor.set_data_from_numpy(np.array(values, dtype=object if name == "city" else np.float32))
            inputs.append(tensor)
        result = client.infer("ensemble", inputs)   # unasked: probabilities and predicted, to raw columns
        np.testing.assert_allclose(result.as_numpy("probabilities"), mean, rtol=1e-5, atol=1e-6)
        assert [v.decode() for v in result.as_numpy("predicted")] == classes

    request = service_pb2.ModelInferRequest(model_name="mlp")
    for name, values in ROWS.items():
        tensor = request.inputs.add(name=name, datatype="BYTES" if name == "city" else "FP32", shape=[len(values)])
        if name == "city":
            tensor.contents.bytes_contents.extend(v.encode() for v in values)
        else:
            tensor.contents.fp32_contents.extend(values)
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        outputs = {o.name: o for o in stub.ModelInfer(request, timeout=10).outputs}
        np.testing.assert_allclose(np.reshape(outputs["probabilities"].contents.fp32_contents, (3, 2)), local["mlp"],
                                   rtol=1e-5, atol=1e-6)
        assert [v.decode() for v in outputs["predicted"].contents.bytes_contents] == \
            [CLASSES[i] for i in np.argmax(local["mlp"], axis=1)]
        request.inputs[2].datatype = "FP32"
        with pytest.raises(grpc.RpcError) as error:
            stub.ModelInfer(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'city' is categorical" in error.value.details()


def test_a_missing_or_mistyped_column_is_a_400_naming_it(cluster):
    url, _, _, _ = cluster
    missing = infer(url, "mlp", columns_request({"age": [1.0], "city": ["rome"]}))
    assert missing.status == 400 and "needs raw column(s) 'size'" in missing.json()["error"]
    mistyped = columns_request({"age": [1.0], "size": [0.0], "city": ["rome"]})
    mistyped["inputs"][2]["datatype"] = "FP32"
    answer = infer(url, "ensemble", mistyped)
    assert answer.status == 400 and "'city' is categorical" in answer.json()["error"]


def test_loadtest_over_http_sends_a_data_specs_rows_as_raw_columns(cluster, tmp_path):
    url, _, spec, _ = cluster
    report_file = tmp_path / "load.json"
    done = subprocess.run([sys.executable, "-m", "zmqflow", "loadtest", "--http", url, "--model-name", "ensemble",
                           "--data", str(spec), "--split", "train", "--rows", "4", "--rate", "100", "--duration-secs", "1",
                           "--deadline-ms", "2000", "--max-failures", "0", "--json-out", str(report_file)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_file.read_text())
    print(f"\nloadtest --http --data: {report['overall']}")
    assert report["overall"]["answered"] == report["overall"]["requests"] == 100
    assert report["requests_from"] == "train split of data (120 rows) as raw columns"


def test_the_rows_of_a_split_become_consecutive_raw_column_bodies(cluster):
    from zmqflow.loadtest.http_target import data_bodies
    url, _, spec, _ = cluster
    metadata = plain_http.request(url, path="/v2/models/ensemble").json()
    bodies, _ = data_bodies(metadata, str(spec), "train", rows=50)
    assert len(bodies) == 2   # 120 rows: two whole blocks of 50, cycled
    first, second = (json.loads(b)["inputs"] for b in bodies)
    assert [i["name"] for i in first] == ["age", "size", "city"] and first[2]["datatype"] == "BYTES"
    lines = (spec.parent / "train.csv").read_text().splitlines()[1:]
    assert first[1]["data"][0] == pytest.approx(float(lines[0].split(",")[2]))
    assert second[2]["data"][0] == lines[50].split(",")[1]


def test_a_model_without_raw_columns_is_refused_by_the_http_loadtest(topology, cluster, tmp_path):
    _, _, spec, _ = cluster
    done = subprocess.run([sys.executable, "-m", "zmqflow", "loadtest", "--http", topology.gateway, "--data", str(spec),
                           "--duration-secs", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "takes no raw rows over HTTP: it was not trained on a data spec" in done.stderr
