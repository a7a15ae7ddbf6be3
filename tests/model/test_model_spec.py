"""Model specs: validation, the variable list, deterministic initial values, user models."""

import json

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.models.registry import load_model
from zmqflow.common.variables import VariableSpec
from zmqflow.models.spec import Model, read_spec, validate_spec

pytestmark = pytest.mark.unit

MNIST = {"type": "mlp", "layers": [784, 100, 10], "activation": "sigmoid",
         "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1, "dtype": "float32"}


class TinyLinear:
    """A user model plugged in as 'tests.model.test_model_spec:TinyLinear': softmax regression."""

    def __init__(self, spec):
        self.n_in, self.classes = spec["inputs"], spec["classes"]

    def variables(self):
        return [VariableSpec("linear/weights", (self.n_in, self.classes))]

    def initial_values(self, seed):
        return {"linear/weights": np.random.default_rng(seed).normal(size=(self.n_in, self.classes)).astype(np.float32)}

    def predict(self, params, x):
        z = x @ params["linear/weights"]
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def step(self, params, batch):
        x, y = batch
        p = self.predict(params, x)
        loss = float(-np.log(p[np.arange(len(y)), y]).mean())
        p[np.arange(len(y)), y] -= 1
        return loss, {"linear/weights": x.T @ p / len(y)}, {"loss": loss}


def mlp_variables(spec):
    """(name, shape, dtype) of the built-in MLP's variables: its checkpoints' layout."""
    return [(v.name, v.shape, v.dtype) for v in load_model(spec).variables()]


def mlp_initial_values(spec, seed=None):
    return load_model(spec).initial_values(seed)


class NotAModel:
    def __init__(self, spec):
        pass


def test_mnist_variable_list():
    assert mlp_variables(validate_spec(MNIST)) == [
        ("hidden/weights", (784, 100), "float32"),
        ("hidden/biases", (100,), "float32"),
        ("softmax/weights", (100, 10), "float32"),
        ("softmax/biases", (10,), "float32"),
    ]


def test_layer_names_for_other_depths():
    deep = validate_spec({"type": "mlp", "layers": [8, 6, 4, 3]})
    assert [v[0] for v in mlp_variables(deep)] == [
        "hidden1/weights", "hidden1/biases", "hidden2/weights", "hidden2/biases", "softmax/weights", "softmax/biases"]
    assert [v[0] for v in mlp_variables(validate_spec({"type": "mlp", "layers": [8, 3]}))] == [
        "softmax/weights", "softmax/biases"]


def test_defaults_are_filled_in():
    spec = validate_spec({"type": "mlp", "layers": [4, 2]})
    assert spec == {"type": "mlp", "layers": [4, 2], "activation": "sigmoid", "init": {"kind": "glorot_uniform"},
                    "seed": 0, "dtype": "float32", "loss": "softmax_cross_entropy"}


@pytest.mark.parametrize("change, field", [
    ({"type": None}, "type"),
    ({"type": "perceptron"}, "type"),
    ({"layers": [784]}, "layers"),
    ({"layers": [784, 0, 10]}, "layers"),
    ({"layers": [784, 100, 1]}, "layers"),
    ({"layers": "784,10"}, "layers"),
    ({"activation": "softplus"}, "activation"),
    ({"init": {"kind": "orthogonal"}}, "init.kind"),
    ({"init": {"kind": "truncated_normal", "stddev": -1}}, "init.stddev"),
    ({"init": {"kind": "zeros", "stddev": 1}}, "init.stddev"),
    ({"seed": -3}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"dtype": "int32"}, "dtype"),
    ({"loss": "hinge"}, "loss"),           # (mse and huber make it a regressor: tests/model/test_fitted_head.py)
    ({"dropout": 0.5}, "dropout"),
])
def test_validation_names_the_bad_field(change, field):
    with pytest.raises(InvalidArgumentError, match=f"'{field}'"):
        validate_spec({**MNIST, **change})


def test_initial_values_are_deterministic_and_seeded():
    spec = validate_spec(MNIST)
    first, again = mlp_initial_values(spec), mlp_initial_values(dict(spec))
    assert first.keys() == again.keys()
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])
        assert first[name].dtype == np.float32
    other = mlp_initial_values(spec, seed=2)
    assert not np.array_equal(first["hidden/weights"], other["hidden/weights"])
    assert not np.array_equal(first["hidden/weights"][:100, :10], first["softmax/weights"][:, :10])


def test_initializers_follow_tensorflow():
    values = mlp_initial_values(validate_spec(MNIST))
    w = values["hidden/weights"]
    assert np.abs(w).max() <= 0.2 and 0.07 < w.std() < 0.1  # truncated at 2 stddev
    assert not values["hidden/biases"].any()
    glorot = mlp_initial_values(validate_spec({**MNIST, "init": "glorot_uniform"}))["hidden/weights"]
    limit = np.sqrt(6 / (784 + 100))
    assert np.abs(glorot).max() <= limit and np.abs(glorot).max() > 0.9 * limit
    zeros = mlp_initial_values(validate_spec({**MNIST, "init": {"kind": "zeros"}, "dtype": "float64"}))
    assert not zeros["softmax/weights"].any() and zeros["softmax/weights"].dtype == np.float64


def test_read_spec_from_json_yaml_and_files(tmp_path):
    assert read_spec(json.dumps(MNIST)) == MNIST
    assert read_spec("type: mlp\nlayers: [4, 3]\n") == {"type": "mlp", "layers": [4, 3]}
    path = tmp_path / "model.yaml"
    path.write_text("type: mlp\nlayers: [4, 3]\nseed: 7\n")
    assert read_spec(str(path))["seed"] == 7 and read_spec(path)["seed"] == 7
    with pytest.raises(NotFoundError, match="missing.json"):
        read_spec(str(tmp_path / "missing.json"))
    with pytest.raises(InvalidArgumentError):
        read_spec("[1, 2]")


def test_load_model_builtin_mlp():
    model = load_model(MNIST)
    assert isinstance(model, Model)
    assert [v.name for v in model.variables()] == [v[0] for v in mlp_variables(validate_spec(MNIST))]


def test_load_model_user_class():
    model = load_model({"type": "tests.model.test_model_spec:TinyLinear", "inputs": 4, "classes": 3})
    assert isinstance(model, TinyLinear)
    params = model.initial_values(0)
    x, y = np.eye(4, dtype=np.float32), np.array([0, 1, 2, 0])
    loss, grads, _ = model.step(params, (x, y))
    assert loss > 0 and grads["linear/weights"].shape == (4, 3)
    np.testing.assert_allclose(model.predict(params, x).sum(axis=1), 1, rtol=1e-6)


@pytest.mark.parametrize("kind", ["tests.model.no_such_module:Model", "tests.model.test_model_spec:Missing",
                                  "tests.model.test_model_spec:NotAModel"])
def test_load_model_user_class_errors(kind):
    with pytest.raises(InvalidArgumentError, match="tests.model"):
        load_model({"type": kind})
