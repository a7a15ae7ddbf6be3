"""Serving any model: the request schema comes from the checkpoint (inputs, and raw records for a
model trained on a data spec), the aggregator forwards several inputs or records and combines by
the task, and names the combined prediction. Real server and aggregator processes."""

from pathlib import Path

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.clients.serve import ModelClient
from zmqflow.inputs.data_spec import load_spec, model_inputs
from tests.support.tabular import checkpoint, spec_dict, write_csv

pytestmark = pytest.mark.service

EMBEDDING_MODEL = '''
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Concatenate, Dense, Embedding, Flatten, Input
from zmqflow.models.network import Network

def build(input_signature):
    numeric, city = Input(input_signature["input"][0], name="input"), Input((1,), dtype="int64", name="city")
    hidden = Concatenate()([numeric, Flatten()(Embedding(4, 3)(city))])
    return LayerModel(Network([numeric, city], Dense(2, activation="softmax")(hidden)), seed=0)
'''


@pytest.fixture(scope="module")
def served(tmp_path_factory, module_processes):
    root = tmp_path_factory.mktemp("any-model")
    write_csv(root / "train.csv", 120, seed=0)
    (root / "embedding_model.py").write_text(EMBEDDING_MODEL)
    out = {}
    for name, encode, model_spec, task in (
            ("mlp", "one_hot", "mlp", "multiclass"),
            ("mlp2", "one_hot", "logistic", "multiclass"),
            ("embedding", "ids", f"{root}/embedding_model.py:build", "multiclass"),
            ("linear1", "one_hot", "linear", "regression"),
            ("linear2", "one_hot", "linear", "regression")):
        spec = load_spec(spec_dict(root / "train.csv", encode, task))
        model, params = checkpoint(root / name, spec, model_spec, seed=len(out) + 1)
        trust = ["--trust-checkpoint-code"] if model_spec.endswith(":build") else []   # the test's own model file
        proc = module_processes.service("zmqflow.services.serve", ["--checkpoint", str(root / name), "--backend",
                                                                   "numpy", "--max-delay-secs", "0.001", "--model-name", name,
                                                                   *trust])
        out[name] = (proc, spec, model, params)
    return out


RECORDS = {"age": [55.0, 25.5, 40.0], "size": [0.1, -1.0, 2.0], "city": ["rome", "oslo", "lisbon"]}


def table_of(spec, records):
    from zmqflow.inputs.data_spec import Table
    columns = {"age": np.array(records["age"], np.float32), "size": np.array(records["size"], np.float32),
               "city": np.array([c.encode() for c in records["city"]], dtype=object)}
    return Table(columns, ["t"], np.zeros((3, 2), np.int64))


def local_outputs(served, *names):
    """What each named member's model answers for RECORDS, computed here."""
    outputs = []
    for name in names:
        _, spec, model, params = served[name]
        outputs.append(model.predict(params, model_inputs(spec, table_of(spec, RECORDS))))
    return outputs


def test_the_schema_comes_from_the_checkpoint(served):
    proc, spec, _, _ = served["embedding"]
    with ModelClient(proc.endpoint, timeout=10) as client:
        schema = client.model_info()["schema"]
    assert schema["inputs"] == [{"name": "input", "shape": [2], "dtype": "float32"},
                                {"name": "city", "shape": [1], "dtype": "int64"}]
    assert schema["output"] == {"width": 2, "task": "multiclass", "classes": ["cat", "dog"]}
    assert [f["name"] for f in schema["features"]] == ["age", "size", "city"]


def test_records_are_made_into_inputs_as_in_training_and_name_the_class(served):
    proc, spec, model, params = served["mlp"]
    expected = model.predict(params, model_inputs(spec, table_of(spec, RECORDS)))
    with ModelClient(proc.endpoint, timeout=10) as client:
        probs, info = client.predict_records(RECORDS)
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)
    assert info["predicted"] == [["cat", "dog"][i] for i in np.argmax(expected, axis=1)]


def test_a_model_of_two_inputs_takes_named_or_ordered_tensors_and_records(served):
    proc, spec, model, params = served["embedding"]
    x = model_inputs(spec, table_of(spec, RECORDS))
    assert set(x) == {"input", "city"}
    expected = model.predict(params, x)
    with ModelClient(proc.endpoint, timeout=10) as client:
        np.testing.assert_allclose(client.predict({"city": x["city"], "input": x["input"]})[0], expected, rtol=1e-5)
        np.testing.assert_allclose(client.predict_records(RECORDS)[0], expected, rtol=1e-5)
        with pytest.raises(InvalidArgumentError, match=r"input 'city' must be integers of shape \[n >= 1, 1\], "
                                                       r"got float32 \[3, 1\]"):
            client.predict({"input": x["input"], "city": x["city"].astype(np.float32)})
        with pytest.raises(InvalidArgumentError, match=r"predict takes 2 tensor\(s\): input \[n, 2\] float32, "
                                                       r"city \[n, 1\] int64; got 1 unnamed tensor\(s\)"):
            client.predict(x["input"])
        with pytest.raises(InvalidArgumentError, match=r"records lack column 'size' \(feature 'size'\)"):
            client.predict_records({"age": [1.0], "city": ["rome"]})
        with pytest.raises(InvalidArgumentError, match=r"column 'age' \(feature 'age'\) holds 'old', not a number"):
            client.predict_records({**RECORDS, "age": [1.0, "old", 2.0]})


def test_the_aggregator_forwards_records_and_names_the_combined_class(served, module_processes):
    members = [served["mlp"][0], served["mlp2"][0]]
    agg = module_processes.service("zmqflow.services.aggregator",
                                   [arg for p in members for arg in ("--member", p.endpoint)])
    outputs = local_outputs(served, "mlp", "mlp2")
    with AggregatorClient(agg.endpoint, timeout=10) as client:
        probs, info = client.predict_records(RECORDS, deadline_ms=5000, min_members=2)
        np.testing.assert_allclose(probs, np.mean(outputs, axis=0), rtol=1e-5, atol=1e-6)
        assert info["predicted"] == [["cat", "dog"][i] for i in np.argmax(np.mean(outputs, axis=0), axis=1)]
        assert sorted(info["answered"]) == sorted(p.endpoint for p in members)


def test_the_aggregator_forwards_several_inputs(served, module_processes):
    proc, spec, model, params = served["embedding"]
    agg = module_processes.service("zmqflow.services.aggregator", ["--member", proc.endpoint])
    x = model_inputs(spec, table_of(spec, RECORDS))
    with AggregatorClient(agg.endpoint, timeout=10) as client:
        np.testing.assert_allclose(client.predict(x, deadline_ms=5000)[0], model.predict(params, x), rtol=1e-5)


def test_a_regression_ensemble_is_the_mean_or_median_of_its_members_and_refuses_vote(served, module_processes,
                                                                                      tmp_path):
    members = [served["linear1"][0], served["linear2"][0]]
    (tmp_path / "combine.py").write_text("import numpy as np\n"
                                         "def lowest(answers, weights):\n"
                                         "    return np.min(np.stack(answers), axis=0)\n")
    agg = module_processes.service("zmqflow.services.aggregator", [
        *[arg for p in members for arg in ("--member", p.endpoint)], "--combine", f"{tmp_path}/combine.py:lowest"])
    outputs = local_outputs(served, "linear1", "linear2")
    with AggregatorClient(agg.endpoint, timeout=10) as client:
        lowest, info = client.predict_records(RECORDS, deadline_ms=5000, min_members=2)
        np.testing.assert_allclose(lowest, np.min(outputs, axis=0), rtol=1e-5)
        assert info["combine"].endswith("combine.py:lowest")
        assert info["predicted"] == pytest.approx(np.min(outputs, axis=0)[:, 0].tolist(), rel=1e-5)
        mean, _ = client.predict_records(RECORDS, deadline_ms=5000, min_members=2, combine="mean")
        np.testing.assert_allclose(mean, np.mean(outputs, axis=0), rtol=1e-5)
        with pytest.raises(InvalidArgumentError, match=r"vote needs class probabilities; these answers have one "
                                                       r"output \(a regression\)"):
            client.predict_records(RECORDS, deadline_ms=5000, min_members=2, combine="vote")


def test_the_load_tester_sends_the_rows_of_a_data_file_or_random_rows_in_the_members_schema(
        served, module_processes, tmp_path):
    import json
    import subprocess
    import sys
    import yaml
    proc, spec, _, _ = served["embedding"]
    agg = module_processes.service("zmqflow.services.aggregator", ["--member", proc.endpoint])
    (tmp_path / "data.yaml").write_text(yaml.safe_dump(spec.raw))
    for extra, source in ((["--data", str(tmp_path / "data.yaml"), "--split", "train"], "train split of data (120 rows)"),
                          ([], "random rows of input [2] float32, city [1] int64")):
        out = tmp_path / "load.json"
        result = subprocess.run([sys.executable, "-m", "zmqflow", "loadtest", "--address", agg.endpoint, "--rate", "50",
                                 "--duration-secs", "1", "--rows", "4", "--deadline-ms", "2000", "--max-failures", "0",
                                 "--json-out", str(out), *extra], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        report = json.loads(out.read_text())
        assert report["requests_from"] == source
        assert report["overall"]["requests"] == 50 and report["overall"]["failed"] == 0


def test_predict_asks_a_running_server_or_aggregator_what_the_checkpoint_answers(served, module_processes, tmp_path):
    import subprocess
    import sys
    proc, spec, _, _ = served["mlp"]
    csv_path = spec.raw["files"]["train"]
    agg = module_processes.service("zmqflow.services.aggregator", ["--member", proc.endpoint])
    runs = {}
    for name, where in (("server", ["--address", proc.endpoint]), ("aggregator", ["--address", agg.endpoint]),
                        ("checkpoint", ["--checkpoint", str(Path(csv_path).parent / "mlp")])):
        result = subprocess.run([sys.executable, "-m", "zmqflow", "predict", *where, "--input", csv_path],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        runs[name] = result.stdout.splitlines()
    assert runs["server"][0] == "class,p_cat,p_dog" and len(runs["server"]) == 121
    assert runs["server"] == runs["checkpoint"] == runs["aggregator"]
    refused = subprocess.run([sys.executable, "-m", "zmqflow", "predict", "--input", csv_path],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "give --checkpoint DIR or --address ENDPOINT" in refused.stderr


def test_predict_through_an_aggregator_dials_only_the_aggregator(served, module_processes, monkeypatch):
    """A host in front of a deployment reaches the aggregator's published port, never the members' in-cluster
    names (serve0:5700): the aggregator relays its members' model_info, and predict asks nothing else."""
    from zmqflow.common.clients import aggregator as aggregator_clients, serve as serve_clients
    from zmqflow.common.errors import UnavailableError
    from zmqflow.jobs.predict import predict_served
    proc, spec, _, _ = served["mlp"]
    agg = module_processes.service("zmqflow.services.aggregator", ["--member", proc.endpoint])
    with serve_clients.ModelClient(proc.endpoint, timeout=10) as member, \
            aggregator_clients.AggregatorClient(agg.endpoint, timeout=10) as client:
        assert client.model_info()["schema"] == member.model_info()["schema"]
    dialled = []
    for module, name in ((serve_clients, "ModelClient"), (aggregator_clients, "AggregatorClient")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda address, *a, _original=original, **k: (
            dialled.append(address), _original(address, *a, **k))[1])
    columns, rows = predict_served(agg.endpoint, spec.raw["files"]["train"])
    assert columns == ["class", "p_cat", "p_dog"] and len(rows) == 120
    assert set(dialled) == {agg.endpoint}
    empty = module_processes.service("zmqflow.services.aggregator", [])
    with aggregator_clients.AggregatorClient(empty.endpoint, timeout=10) as client:
        with pytest.raises(UnavailableError, match="no healthy member to ask for its model"):
            client.model_info()


@pytest.mark.unit
def test_a_blank_record_value_takes_its_numeric_features_default_as_a_blank_csv_field_does(tmp_path):
    from zmqflow.inputs.data_spec import to_config
    from zmqflow.services.serve.schema import RequestSchema
    write_csv(tmp_path / "t.csv", 60, seed=1)
    raw = spec_dict(tmp_path / "t.csv")
    raw["features"]["age"] = {"type": "numeric", "default": 40}
    spec = load_spec(raw)
    model, _ = checkpoint(tmp_path / "ckpt", spec, "mlp", seed=1)
    schema = RequestSchema(model, to_config(spec))
    row = {"size": [0.5], "city": ["rome"]}
    for blank in (None, "", "   "):
        np.testing.assert_array_equal(schema.from_records({**row, "age": [blank]})[0],
                                      schema.from_records({**row, "age": [40]})[0])
