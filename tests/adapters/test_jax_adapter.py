"""The JAX adapter: a pure function and its pytree as a zmqflow model, checked against zmqflow's own layers."""

import numpy as np
import pytest

from zmqflow.models.layer_model import LayerModel
from zmqflow.models.layers import Dense
from zmqflow.models.network import Sequential
from zmqflow.models.protocol import Model, input_signature

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'zmqflow[jax]')")
jnp = jax.numpy
from zmqflow.adapters.jax import JaxModel  # noqa: E402  (after the skip: JAX is optional)

pytestmark = pytest.mark.unit


def apply(params, x):
    h = jax.nn.tanh(x @ params["dense"]["kernel"] + params["dense"]["bias"])
    return h @ params["dense_1"]["kernel"] + params["dense_1"]["bias"]


def same_weights_both_ways():
    ours = LayerModel(Sequential([Dense(5, activation="tanh"), Dense(3)], input_shape=(4,)), seed=2)
    values = ours.initial_values()
    pytree = {"dense": {"kernel": values["dense/kernel"], "bias": values["dense/bias"]},
              "dense_1": {"kernel": values["dense_1/kernel"], "bias": values["dense_1/bias"]}}
    return ours, JaxModel(apply, pytree, input_shape=(4,)), values


def test_pytree_leaves_become_named_variables():
    _, model, values = same_weights_both_ways()
    assert isinstance(model, Model)
    assert [v.name for v in model.variables()] == ["dense/bias", "dense/kernel", "dense_1/bias", "dense_1/kernel"]
    assert input_signature(model) == {"input": ((4,), "float32")}
    initial = model.initial_values()
    assert all(np.array_equal(initial[name], values[name]) for name in initial)
    drawn = JaxModel(apply, lambda key: {"w": jax.random.normal(key, (4, 3))}, input_shape=(4,))
    assert not np.array_equal(drawn.initial_values(0)["w"], drawn.initial_values(1)["w"])


@pytest.mark.parametrize("loss", ["softmax_cross_entropy", "sigmoid_cross_entropy", "mse"])
def test_same_loss_gradients_and_predictions_as_zmqflows_layers(loss):
    ours, _, values = same_weights_both_ways()
    ours = LayerModel(ours.network, loss=loss if loss != "mse" else "mse", seed=2)
    _, theirs, _ = same_weights_both_ways()
    theirs = JaxModel(apply, theirs.init, input_shape=(4,), loss=loss)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 4)).astype(np.float32)
    y = rng.integers(0, 3, 6) if loss == "softmax_cross_entropy" else (rng.random((6, 3)) > 0.5).astype(np.float32)
    loss_ours, grads_ours, _ = ours.step(values, (x, y))
    loss_theirs, grads_theirs, metrics = theirs.step(values, (x, y))
    assert loss_ours == pytest.approx(loss_theirs, rel=1e-5)
    for name in grads_ours:
        np.testing.assert_allclose(grads_ours[name], grads_theirs[name], rtol=1e-4, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(ours.predict(values, x), theirs.predict(values, x), rtol=1e-5, atol=1e-6)
    assert metrics["loss"] == loss_theirs


def test_a_jax_model_learns():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 4)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 2] > 1).astype(np.int64)
    model = JaxModel(apply, lambda key: {"dense": {"kernel": jax.random.normal(key, (4, 5)) * 0.5, "bias": jnp.zeros(5)},
                                          "dense_1": {"kernel": jax.random.normal(key, (5, 3)) * 0.5,
                                                      "bias": jnp.zeros(3)}}, input_shape=(4,))
    params = model.initial_values(0)
    for _ in range(200):
        _, grads, _ = model.step(params, (x, y))
        params = {n: params[n] - 0.5 * grads[n] for n in params}
    assert np.mean(np.argmax(model.predict(params, x), axis=1) == y) > 0.9
    with pytest.raises(Exception, match="parameter 'dense/bias' is missing"):
        model.predict({}, x)
