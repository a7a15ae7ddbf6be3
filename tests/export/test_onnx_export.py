"""ONNX export: each exported graph run by onnxruntime answers what zmqflow's own predict answers
(max abs difference <= 1e-5, float32), for the built-in MLP, a trained CNN, an image stack of every
padding, pooling and normalization, a functional model of two inputs, and branches joined by Add; models and layers
without a mapping are refused by name."""

import numpy as np
import pytest

from zmqflow.common.errors import FailedPreconditionError, UnimplementedError
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import (Activation, Add, AvgPool2D, BatchNorm, Concatenate, Conv2D, Dense, Dropout, Embedding,
                                   Flatten, Input, Layer, LayerNorm, MaxPool2D, Reshape)
from zmqflow.models.network import Network, Sequential
from zmqflow.models.onnx_export import to_onnx
from zmqflow.models.registry import load_model

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (pip install 'zmqflow[test]')")
pytest.importorskip("onnx", reason="onnx is not installed (pip install 'zmqflow[onnx]')")

pytestmark = pytest.mark.unit
TOLERANCE = 1e-5


def run_onnx(proto, inputs):
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)[0]


def assert_matches(model, params, inputs, name="model"):
    """The exported graph's answer for `inputs` ({input: array}) against model.predict's; returns the difference."""
    proto = to_onnx(model, params, name=name, step=1)
    expected = model.predict(params, inputs if len(inputs) > 1 else next(iter(inputs.values())))
    got = run_onnx(proto, inputs)
    difference = float(np.max(np.abs(got - expected)))
    print(f"{name}: max abs difference {difference:.2e} over {expected.size} outputs")
    assert got.shape == expected.shape and got.dtype == np.float32
    assert difference <= TOLERANCE
    return proto


def randomized(model, seed):
    """Initial values with every zero/one initializer (biases, gammas, moving statistics) drawn too, so
    that each weight's place in the graph matters."""
    rng = np.random.default_rng(seed)
    params = model.initial_values(seed)
    for v in model.variables():
        if v.name.endswith("moving_variance"):
            params[v.name] = rng.uniform(0.5, 2.0, v.shape).astype(v.dtype)
        elif v.name.endswith(("bias", "beta", "gamma", "moving_mean", "biases")):
            params[v.name] = rng.normal(0.0, 0.5, v.shape).astype(v.dtype)
    return params


@pytest.mark.parametrize("activation, dtype", [("sigmoid", "float32"), ("relu", "float32"), ("tanh", "float32"),
                                               ("none", "float32"), ("sigmoid", "float64")])
def test_the_builtin_mlp_matches(activation, dtype):
    """A float64 model computes in float64 and answers float32, as a server does."""
    model = load_model({"type": "mlp", "layers": [20, 16, 12, 5], "activation": activation, "seed": 3, "dtype": dtype})
    params = randomized(model, 3)
    x = np.random.default_rng(0).normal(size=(9, 20)).astype(dtype)
    proto = assert_matches(model, params, {"input": x}, f"mlp-{activation}-{dtype}")
    assert [o.name for o in proto.graph.output] == ["probabilities"]


def test_a_trained_cnn_matches(trained_cnn):
    losses = trained_cnn["losses"]
    print(f"cnn loss {np.mean(losses[:5]):.3f} -> {np.mean(losses[-5:]):.3f} after {len(losses)} SGD steps")
    assert np.mean(losses[-5:]) < np.mean(losses[:5])
    proto = assert_matches(trained_cnn["model"], trained_cnn["params"], {"input": trained_cnn["test_x"]}, "trained-cnn")
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Transpose") == 2 and ops.count("Conv") == 2   # one NHWC -> NCHW run, and back


def test_images_of_every_padding_pooling_and_norm_match():
    """Odd sizes and strides (TensorFlow's 'same' puts the odd pixel bottom/right), average pooling over
    partial windows, BatchNorm inside the channels-first run, gelu, and a sigmoid head."""
    net = Sequential([Reshape((7, 9, 3)), Conv2D(5, 3, strides=2, padding="same"), BatchNorm(), Activation("gelu"),
                      AvgPool2D(2, strides=1, padding="same"), MaxPool2D(3, strides=2, padding="same"),
                      Conv2D(4, 2, padding="valid", activation="tanh"), AvgPool2D(2, padding="same"), Flatten(),
                      Dense(6, activation="softmax"), Dense(3)], input_shape=(189,))
    model = LayerModel(net, loss="sigmoid_cross_entropy", seed=5)
    x = np.random.default_rng(1).normal(size=(6, 189)).astype(np.float32)
    assert_matches(model, randomized(model, 5), {"input": x}, "image-stack")


def two_input_model(loss="softmax_cross_entropy"):
    numeric, ids = Input((6,), name="numeric"), Input((3,), dtype="int64", name="city")
    hidden = Dropout(0.5)(LayerNorm()(BatchNorm()(Dense(8, activation="relu")(numeric))))
    joined = Concatenate()([hidden, Flatten()(Embedding(10, 4)(ids))])
    return LayerModel(Network([numeric, ids], Dense(3)(joined)), loss=loss, seed=7)


@pytest.mark.parametrize("loss, output", [("softmax_cross_entropy", "probabilities"), ("mse", "predictions")])
def test_a_functional_model_of_two_inputs_matches(loss, output):
    model = two_input_model(loss)
    rng = np.random.default_rng(2)
    inputs = {"numeric": rng.normal(size=(11, 6)).astype(np.float32), "city": rng.integers(0, 10, (11, 3))}
    proto = assert_matches(model, randomized(model, 7), inputs, f"two-inputs-{loss}")
    graph = proto.graph
    assert [(i.name, i.type.tensor_type.shape.dim[0].dim_param) for i in graph.input] == [("numeric", "batch"),
                                                                                          ("city", "batch")]
    assert [o.name for o in graph.output] == [output]
    assert {"Gather", "LayerNormalization", "Concat"} <= {n.op_type for n in graph.node}
    assert "Dropout" not in {n.op_type for n in graph.node}


def test_branches_joined_by_add_match():
    x = Input((5,), name="x")
    trunk = Dense(6, activation="relu")(x)
    joined = Add()([Dense(4, activation="tanh")(trunk), Dense(4, activation="relu")(trunk), Dense(4)(trunk)])
    model = LayerModel(Network(x, Dense(3)(joined)), seed=3)
    x = np.random.default_rng(4).normal(size=(7, 5)).astype(np.float32)
    proto = assert_matches(model, randomized(model, 3), {"x": x}, "branches-added")
    assert "Sum" in {n.op_type for n in proto.graph.node}


def test_metadata_names_the_model_the_version_and_the_step():
    from zmqflow import __version__
    model = load_model({"type": "logistic", "inputs": 4, "classes": 3})
    proto = to_onnx(model, model.initial_values(0), name="iris", step=42, version=__version__)
    props = {p.key: p.value for p in proto.metadata_props}
    assert (props["zmqflow.model"], props["zmqflow.version"], props["zmqflow.step"]) == ("iris", __version__, "42")
    assert proto.producer_name == "zmqflow" and proto.opset_import[0].version == 17


class Squash(Layer):
    kind = "squash"

    def forward(self, params, x, ctx):
        return x


def test_a_layer_without_a_mapping_is_refused_by_name():
    model = LayerModel(Sequential([Dense(4), Squash(name="my_squash"), Dense(2)], input_shape=(3,)))
    with pytest.raises(UnimplementedError, match="layer 'my_squash' \\(Squash\\) has no ONNX mapping"):
        to_onnx(model, model.initial_values(0))


def test_an_adapted_jax_model_exports_through_jax():
    jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'zmqflow[jax]')")
    from zmqflow.adapters.jax import JaxModel
    model = JaxModel(lambda p, x: x @ p["w"], {"w": jax.numpy.zeros((4, 2))}, input_shape=(4,))
    with pytest.raises(UnimplementedError, match="adapted from JAX.*export this one from JAX with jax2onnx"):
        to_onnx(model, model.initial_values(0))


def test_without_onnx_the_error_names_the_extra(monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "onnx", None)   # import fails as if it were not installed
    model = load_model({"type": "logistic", "inputs": 4, "classes": 3})
    with pytest.raises(FailedPreconditionError, match=r"pip install 'zmqflow\[onnx\]'"):
        to_onnx(model, model.initial_values(0))


def test_a_standardised_regression_answers_in_its_target_units():
    """A regression trained on a standardised target (issue 24) exports its outputs * std + mean too."""
    model = load_model({"type": "mlp", "layers": [4, 8, 2], "loss": "mse",
                        "target_scale": {"mean": [150.0, -3.0], "std": [50.0, 0.5]}})
    inputs = {"input": np.random.default_rng(3).normal(size=(9, 4)).astype(np.float32)}
    proto = assert_matches(model, model.initial_values(0), inputs, "standardised-regression")
    assert abs(float(run_onnx(proto, inputs)[:, 0].mean()) - 150) < 50          # not the standardised values
