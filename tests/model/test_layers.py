"""Layers, containers and LayerModel: shapes, names, gradients of whole networks, training that learns."""

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.variables import IndexedSlices
from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import (Activation, AvgPool2D, BatchNorm, Concatenate, Conv2D, Dense, Dropout, Embedding,
                                   Flatten, Input, LayerNorm, MaxPool2D, Reshape)
from zmqflow.models.network import Network, Sequential
from zmqflow.models.protocol import Model, every_gradient, input_signature, zero_inputs
from tests.model.gradients import numeric_gradient

pytestmark = pytest.mark.unit


def small_cnn(dtype="float64"):
    net = Sequential([Reshape((6, 6, 1)), Conv2D(3, 3, padding="same", activation="relu"), MaxPool2D(),
                      Conv2D(4, 2, activation="tanh"), AvgPool2D(2, padding="same"), Flatten(),
                      LayerNorm(), Dense(5, activation="gelu"), Dense(3)], input_shape=(36,))
    return LayerModel(net, dtype=dtype, seed=3)


def test_sequential_names_shapes_and_variables_like_keras():
    model = small_cnn()
    assert isinstance(model, Model)
    names = [v.name for v in model.variables()]
    assert names == ["conv2d/kernel", "conv2d/bias", "conv2d_1/kernel", "conv2d_1/bias", "layer_normalization/gamma",
                     "layer_normalization/beta", "dense/kernel", "dense/bias", "dense_1/kernel", "dense_1/bias"]
    shapes = {v.name: v.shape for v in model.variables()}
    assert shapes["conv2d/kernel"] == (3, 3, 1, 3) and shapes["conv2d_1/kernel"] == (2, 2, 3, 4)
    assert shapes["dense/kernel"] == (4, 5)   # 6x6 -> pool 3x3 -> valid 2x2 conv: 2x2 -> same pool: 1x1, x 4 filters
    assert input_signature(model) == {"input": ((36,), "float32")}
    assert model.output_shape() == (3,)
    assert "conv2d_1 (conv2d) -> [2, 2, 4]" in model.network.summary()
    values = model.initial_values()
    assert all(values[n].dtype == np.float64 for n in names) and not values["conv2d/bias"].any()
    again = small_cnn().initial_values()
    assert all(np.array_equal(values[n], again[n]) for n in names)   # the same on every task


@pytest.mark.parametrize("loss", ["softmax_cross_entropy", "sigmoid_cross_entropy", "mse", "huber"])
def test_whole_network_gradients_match_finite_differences(loss):
    net = Sequential([Reshape((6, 6, 1)), Conv2D(2, 3, strides=2, padding="same", activation="sigmoid"),
                      Flatten(), BatchNorm(), Dense(4, activation="tanh"), Dense(3)], input_shape=(36,))
    model = LayerModel(net, loss=loss, dtype="float64", seed=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 36))
    y = rng.integers(0, 3, 5) if loss == "softmax_cross_entropy" else rng.random((5, 3)) * (loss != "sigmoid_cross_entropy" or 1)
    if loss == "sigmoid_cross_entropy":
        y = (y > 0.5).astype(float)
    params = model.initial_values()
    loss_value, grads, metrics = model.step(params, (x, y))
    assert set(grads) == {v.name for v in model.variables() if v.trainable}
    for name, g in grads.items():
        expected = numeric_gradient(lambda: model.step(params, (x, y))[0], params[name])
        np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-7, err_msg=name)
    assert metrics["loss"] == loss_value and set(metrics["updates"]) == {"batch_normalization/moving_mean",
                                                                        "batch_normalization/moving_variance"}


def test_batch_norm_moving_statistics_are_non_trainable_and_used_for_inference():
    net = Sequential([BatchNorm(momentum=0.5), Dense(2)], input_shape=(3,))
    model = LayerModel(net, dtype="float64")
    flags = {v.name: v.trainable for v in model.variables()}
    assert flags == {"batch_normalization/gamma": True, "batch_normalization/beta": True,
                     "batch_normalization/moving_mean": False, "batch_normalization/moving_variance": False,
                     "dense/kernel": True, "dense/bias": True}
    params = model.initial_values()
    x = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 7.0]])
    _, grads, metrics = model.step(params, (x, [0, 1]))
    assert "batch_normalization/moving_mean" not in grads
    np.testing.assert_allclose(metrics["updates"]["batch_normalization/moving_mean"], 0.5 * x.mean(axis=0))
    np.testing.assert_allclose(metrics["updates"]["batch_normalization/moving_variance"], 0.5 + 0.5 * x.var(axis=0))
    all_grads = every_gradient(model, model.step(params, (x, [0, 1]))[1])
    assert not all_grads["batch_normalization/moving_mean"].any()   # the workers' form: zeros, never applied
    params["batch_normalization/moving_mean"] = np.array([1.0, 2.0, 3.0])
    params["batch_normalization/moving_variance"] = np.array([4.0, 1.0, 0.25]) - 1e-3
    params["dense/kernel"], params["dense/bias"] = np.eye(3)[:, :2], np.zeros(2)
    out = model.predict(params, np.array([[3.0, 2.0, 3.0]]))
    np.testing.assert_allclose(out, [np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()], rtol=1e-6)


def test_functional_tabular_model_with_an_embedding_and_concatenation():
    numeric_in, category = Input((3,), name="numeric"), Input((1,), dtype="int64", name="city")
    embedded = Flatten()(Embedding(10, 4)(category))
    hidden = Dense(8, activation="relu")(Concatenate()([numeric_in, embedded]))
    model = LayerModel(Network([numeric_in, category], Dense(1)(hidden)), loss="mse", dtype="float64")
    assert input_signature(model) == {"numeric": ((3,), "float32"), "city": ((1,), "int64")}
    assert [v.name for v in model.variables()][:1] == ["embedding/embeddings"]
    rng = np.random.default_rng(0)
    x = {"numeric": rng.standard_normal((6, 3)), "city": rng.integers(0, 10, (6, 1))}
    params = model.initial_values()
    _, grads, _ = model.step(params, (x, rng.standard_normal(6)))
    touched = np.flatnonzero(np.abs(grads["embedding/embeddings"]).sum(axis=1))
    assert set(touched) <= set(x["city"].ravel())   # only the rows the batch used
    assert zero_inputs(model, 2)["city"].shape == (2, 1)
    with pytest.raises(InvalidArgumentError, match="input 'city' is missing"):
        model.predict(params, {"numeric": x["numeric"]})
    with pytest.raises(InvalidArgumentError, match=r"per-example shape \[4\], the model expects \[3\]"):
        model.predict(params, {"numeric": np.zeros((2, 4)), "city": np.zeros((2, 1), int)})


def test_a_model_of_one_input_takes_its_array_or_a_dict_naming_it():
    model = LayerModel(Sequential([Dense(3)], input_shape=(4,)))
    params, x, y = model.initial_values(), np.ones((2, 4), np.float32), np.array([0, 2])
    assert model.input_tensor({"input": x}).value is model.input_tensor(x).value   # one tensor, as a stage takes
    np.testing.assert_array_equal(model.predict(params, {"input": x}), model.predict(params, x))
    assert model.step(params, ({"input": x}, y))[0] == model.step(params, (x, y))[0]


def test_a_sparse_embedding_steps_on_the_rows_the_batch_reads_exactly_as_on_the_whole_table():
    numeric_in, category = Input((3,), name="numeric"), Input((2,), dtype="int64", name="city")
    embedded = Flatten()(Embedding(50, 4)(category))
    dense_table = Flatten()(Embedding(10, 2, sparse=False, name="fixed")(category))
    hidden = Dense(8, activation="tanh")(Concatenate()([numeric_in, embedded, dense_table]))
    model = LayerModel(Network([numeric_in, category], Dense(1)(hidden)), loss="mse", dtype="float64")
    rng = np.random.default_rng(1)
    x = {"numeric": rng.standard_normal((5, 3)), "city": rng.choice([3, 9, 4, 6], (5, 2))}
    y, params = rng.standard_normal(5), model.initial_values()
    rows = model.sparse_rows(x)
    assert list(rows) == ["embedding/embeddings"] and rows["embedding/embeddings"].tolist() == [3, 4, 6, 9]
    loss, grads, _ = model.step(params, (x, y))
    compact = {**params, "embedding/embeddings": params["embedding/embeddings"][rows["embedding/embeddings"]]}
    sparse_loss, sparse_grads, _ = model.step(compact, (x, y), rows=rows)
    assert sparse_loss == pytest.approx(loss, rel=1e-12)
    table = sparse_grads["embedding/embeddings"]
    assert isinstance(table, IndexedSlices) and table.indices.tolist() == [3, 4, 6, 9]
    np.testing.assert_allclose(table.values, grads["embedding/embeddings"][[3, 4, 6, 9]], rtol=1e-12)
    np.testing.assert_allclose(sparse_grads["fixed/embeddings"], grads["fixed/embeddings"], rtol=1e-12)
    with pytest.raises(InvalidArgumentError, match=r"'embedding/embeddings' has shape \[50, 4\], expected \[4, 4\]"):
        model.step(params, (x, y), rows=rows)
    with pytest.raises(ValueError, match="rows of the table that were not pulled"):
        model.step(compact, ({**x, "city": np.full((5, 2), 5)}, y), rows=rows)


def test_layers_learn_a_task():
    """A CNN learns to tell horizontal from vertical bars in a few dozen SGD steps."""
    rng = np.random.default_rng(0)

    def batch(n):
        x = rng.random((n, 8, 8, 1)) * 0.2
        y = rng.integers(0, 2, n)
        for i, label in enumerate(y):
            k = rng.integers(1, 7)
            if label:
                x[i, :, k, 0] += 1.0
            else:
                x[i, k, :, 0] += 1.0
        return x.reshape(n, 64), y
    net = Sequential([Reshape((8, 8, 1)), Conv2D(4, 3, padding="same", activation="relu"), MaxPool2D(),
                      Dropout(0.1), Flatten(), Dense(2)], input_shape=(64,))
    model = LayerModel(net, seed=0)
    params = model.initial_values()
    for _ in range(60):
        loss, grads, metrics = model.step(params, batch(32))
        for name, g in grads.items():
            params[name] -= 0.3 * g
    x, y = batch(200)
    accuracy = np.mean(np.argmax(model.predict(params, x), axis=1) == y)
    assert accuracy > 0.95, accuracy


@pytest.mark.parametrize("build, message", [
    (lambda: Sequential([Conv2D(2, 3)], input_shape=(36,)), "conv2d: Conv2D expects \\[height, width, channels\\]"),
    (lambda: Sequential([Reshape((5, 5, 1))], input_shape=(36,)), "cannot turn \\[36\\]"),
    (lambda: Sequential([Reshape((2, 2, 1)), MaxPool2D(3)], input_shape=(4,)), "window of 3 does not fit"),
    (lambda: Sequential([Dense(0)], input_shape=(3,)), "Dense units must be a positive integer"),
    (lambda: Sequential([Dense(2, activation="swish")], input_shape=(3,)), "unknown activation 'swish'"),
    (lambda: Sequential([Dense(2, name="a"), Dense(2, name="a")], input_shape=(3,)), "must be unique"),
    (lambda: Sequential([Dropout(1.0)], input_shape=(3,)), "Dropout rate"),
])
def test_bad_networks_name_the_layer(build, message):
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_bad_parameters_and_labels_are_named():
    model = small_cnn()
    params = model.initial_values()
    params["dense/kernel"] = np.zeros((3, 3))
    with pytest.raises(InvalidArgumentError, match=r"'dense/kernel' has shape \[3, 3\], expected \[4, 5\]"):
        model.predict(params, np.zeros((1, 36)))
    params = model.initial_values()
    with pytest.raises(InvalidArgumentError, match=r"label value of 3 which is outside the valid range of \[0, 3\)"):
        model.step(params, (np.zeros((2, 36)), [0, 3]))
    assert isinstance(Activation("relu"), object)


def test_layer_devices_are_placement_hints_and_bad_ones_name_the_layer():
    model = LayerModel(Sequential([Dense(4, device="/job:worker/task:1"), Dense(2)], input_shape=(3,)))
    assert [v.device for v in model.variables()] == ["/job:worker/task:1"] * 2 + [None, None]
    with pytest.raises(InvalidArgumentError, match="layer dense: device string '/job:wrker/tsk:1'"):
        LayerModel(Sequential([Dense(4, device="/job:wrker/tsk:1")], input_shape=(3,)))
