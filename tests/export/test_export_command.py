"""`zmqflow export`: a checkpoint written as an ONNX file that onnxruntime runs to the checkpoint's own
predictions (docs/models.md's snippet as written), and the refusals (exit 2) that say why."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow import __version__
from zmqflow.cli.main import main
from zmqflow.common.checkpoints.checkpoint import save_params
from zmqflow.inputs.data_spec import load_spec, model_inputs, read_features
from zmqflow.jobs.export import export_checkpoint
from zmqflow.models.registry import load_model
from tests.support.doc_blocks import python_block
from tests.support.tabular import checkpoint, spec_dict, write_csv

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'zmqflow[test]')")
onnx = pytest.importorskip("onnx", reason="onnx is not installed (pip install 'zmqflow[onnx]')")

pytestmark = pytest.mark.unit
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.service
def test_export_then_onnxruntime_answers_what_the_checkpoint_does(trained_cnn, tmp_path):
    command = [sys.executable, "-m", "zmqflow", "export", "--checkpoint", str(trained_cnn["checkpoint_dir"]),
               "--format", "onnx", "cnn.onnx"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    print(done.stdout)
    assert done.returncode == 0, done.stderr[-2000:]
    size = os.path.getsize(tmp_path / "cnn.onnx")
    assert f"wrote cnn.onnx ({size:,} bytes, ONNX opset 17): model mnist-cnn step 30" in done.stdout
    assert "inputs:  input ['batch', 784] float32" in done.stdout
    assert "outputs: probabilities ['batch', 10] float32" in done.stdout
    assert re.search(r"\d+ nodes: .*Conv 2", done.stdout)

    scope = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(python_block("docs/models.md", "onnxruntime").body, "docs/models.md", "exec"), scope)
    finally:
        os.chdir(cwd)
    expected = trained_cnn["model"].predict(trained_cnn["params"], scope["x"])
    difference = float(np.max(np.abs(scope["probabilities"] - expected)))
    print(f"zmqflow export -> onnxruntime: max abs difference {difference:.2e}, {size:,} bytes")
    assert difference <= 1e-5
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "cnn.onnx")).metadata_props}
    assert (props["zmqflow.model"], props["zmqflow.step"], props["zmqflow.version"]) == ("mnist-cnn", "30", __version__)
    assert json.loads(props["zmqflow.model_spec"])["type"] == "cnn"


def test_one_checkpoint_directory_exports_and_json_says_what_was_written(trained_cnn, tmp_path):
    step_dir = trained_cnn["checkpoint_dir"] / "ckpt-30"
    result = CliRunner().invoke(main, ["export", "--checkpoint", str(step_dir), "--json", "--model-name", "digits",
                                       str(tmp_path / "out" / "m.onnx")])
    assert result.exit_code == 0, result.output
    written = json.loads(result.output)
    assert (written["model"], written["step"], written["checkpoint"]) == ("digits", 30, str(step_dir))
    assert written["bytes"] == os.path.getsize(tmp_path / "out" / "m.onnx")
    assert written["inputs"] == [{"name": "input", "shape": ["batch", 784], "dtype": "float32"}]
    assert written["ops"]["Conv"] == 2 and written["ops"]["MaxPool"] == 2


def test_an_adapted_jax_model_is_sent_to_its_own_framework(tmp_path):
    pytest.importorskip("jax", reason="JAX is not installed (pip install 'zmqflow[jax]')")
    spec = {"type": f"{ROOT}/examples/jax_model.py:build"}
    model = load_model(spec)
    save_params(str(tmp_path / "jax"), 1, model.initial_values(0), {"model": spec})
    result = CliRunner().invoke(main, ["export", "--checkpoint", str(tmp_path / "jax"), "--trust-checkpoint-code",
                                       str(tmp_path / "m.onnx")])
    assert result.exit_code == 2, result.output
    assert "JaxModel is adapted from JAX" in result.output and "with jax2onnx" in result.output
    assert not (tmp_path / "m.onnx").exists()


CUSTOM_LAYER_MODEL = '''
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Dense, Layer
from zmqflow.models.network import Sequential

class Doubled(Layer):
    kind = "doubled"

    def forward(self, params, x, ctx):
        return x

def build(input_signature):
    return LayerModel(Sequential([Dense(4), Doubled(), Dense(2)], input_shape=(3,)))
'''


def test_a_layer_without_a_mapping_is_named(tmp_path):
    (tmp_path / "custom.py").write_text(CUSTOM_LAYER_MODEL)
    spec = {"type": f"{tmp_path}/custom.py:build"}
    save_params(str(tmp_path / "ckpt"), 1, load_model(spec).initial_values(0), {"model": spec})
    result = CliRunner().invoke(main, ["export", "--checkpoint", str(tmp_path / "ckpt"), "--trust-checkpoint-code",
                                       str(tmp_path / "m.onnx")])
    assert result.exit_code == 2, result.output
    assert "layer 'doubled' (Doubled) has no ONNX mapping" in result.output


def test_without_onnx_the_command_names_the_extra(trained_cnn, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)   # import fails as if it were not installed
    result = CliRunner().invoke(main, ["export", "--checkpoint", str(trained_cnn["checkpoint_dir"]),
                                       str(tmp_path / "m.onnx")])
    assert result.exit_code == 2, result.output
    assert "pip install 'zmqflow[onnx]'" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("args, message", [(["--format", "tflite"], "Invalid value for '--format'"),
                                           (["--opset", "13"], "Invalid value for '--opset'")])
def test_a_bad_format_or_opset_is_a_usage_error(trained_cnn, tmp_path, args, message):
    result = CliRunner().invoke(main, ["export", "--checkpoint", str(trained_cnn["checkpoint_dir"]), *args,
                                       str(tmp_path / "m.onnx")])
    assert result.exit_code == 2 and message in result.output, result.output


def test_a_directory_without_a_checkpoint_is_not_found(tmp_path):
    result = CliRunner().invoke(main, ["export", "--checkpoint", str(tmp_path), str(tmp_path / "m.onnx")])
    assert result.exit_code == 1 and "NotFoundError: no committed checkpoint" in result.output, result.output


EMBEDDING_MODEL = '''
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Concatenate, Dense, Embedding, Flatten, Input
from zmqflow.models.network import Network

def build(input_signature):
    numeric, city = Input(input_signature["input"][0], name="input"), Input((1,), dtype="int64", name="city")
    hidden = Concatenate()([numeric, Flatten()(Embedding(4, 3)(city))])
    return LayerModel(Network([numeric, city], Dense(2)(hidden)), seed=0)
'''


def test_a_model_trained_on_a_data_spec_takes_its_model_inputs_and_records_the_spec(tmp_path):
    """The graph takes what the data spec makes of raw rows (here a numeric input and category ids);
    the spec and its statistics travel in the metadata."""
    write_csv(tmp_path / "train.csv", 40, seed=0)
    (tmp_path / "embedding_model.py").write_text(EMBEDDING_MODEL)
    spec = load_spec(spec_dict(tmp_path / "train.csv", encode="ids"))
    model, params = checkpoint(tmp_path / "ckpt", spec, f"{tmp_path}/embedding_model.py:build", seed=3)
    written = export_checkpoint(str(tmp_path / "ckpt"), str(tmp_path / "m.onnx"), trust_checkpoint_code=True)
    assert [(i["name"], i["dtype"]) for i in written["inputs"]] == [("input", "float32"), ("city", "int64")]
    x = model_inputs(spec, read_features(spec, str(tmp_path / "train.csv")))
    got = ort.InferenceSession(str(tmp_path / "m.onnx")).run(None, x)[0]
    difference = float(np.max(np.abs(got - model.predict(params, x))))
    print(f"data-spec model: max abs difference {difference:.2e}")
    assert difference <= 1e-5
    props = {p.key: p.value for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert json.loads(props["zmqflow.data_spec"])["stats"]
