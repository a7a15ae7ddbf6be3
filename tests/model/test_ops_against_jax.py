"""zmqflow's ops against JAX on the same inputs: values and gradients (float32)."""

import numpy as np
import pytest

from zmqflow.models import conv_ops, ops
from zmqflow.models.autograd import variable

jax = pytest.importorskip("jax", reason="JAX is not installed (pip install 'zmqflow[jax]')")
jnp, lax = jax.numpy, jax.lax

pytestmark = pytest.mark.unit
RNG = np.random.default_rng(1)


def compare(ours, theirs, *arrays, rtol=2e-4, atol=2e-5):
    """ours(*Tensors) -> Tensor, theirs(*jnp arrays) -> array: same value, same gradient of sum(w * out)."""
    arrays = [np.asarray(a, np.float32) for a in arrays]
    tensors = [variable(a.copy()) for a in arrays]
    out = ours(*tensors)
    weights = RNG.standard_normal(out.shape).astype(np.float32)
    out.backward(weights * np.ones_like(out.value))
    value = theirs(*arrays)
    np.testing.assert_allclose(out.value, value, rtol=rtol, atol=atol)
    grads = jax.grad(lambda *xs: jnp.sum(weights * theirs(*xs)), argnums=tuple(range(len(arrays))))(*arrays)
    for i, (tensor, g) in enumerate(zip(tensors, grads)):
        np.testing.assert_allclose(tensor.grad, g, rtol=rtol, atol=atol, err_msg=f"input {i}")


def jax_conv(x, k, stride, padding):
    return lax.conv_general_dilated(x, k, (stride, stride), padding.upper(), dimension_numbers=("NHWC", "HWIO", "NHWC"))


@pytest.mark.parametrize("stride, padding", [(1, "same"), (2, "same"), (1, "valid"), (2, "valid")])
def test_conv2d(stride, padding):
    compare(lambda x, k: conv_ops.conv2d(x, k, stride, padding), lambda x, k: jax_conv(x, k, stride, padding),
            RNG.standard_normal((2, 7, 6, 3)), RNG.standard_normal((3, 3, 3, 4)))


@pytest.mark.parametrize("size, stride, padding", [(2, 2, "valid"), (2, 2, "same"), (3, 2, "same"), (3, 1, "valid")])
def test_max_pool(size, stride, padding):
    def theirs(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, size, size, 1), (1, stride, stride, 1), padding.upper())
    compare(lambda x: conv_ops.max_pool2d(x, size, stride, padding), theirs, RNG.standard_normal((2, 7, 5, 3)))


@pytest.mark.parametrize("padding", ["valid", "same"])
def test_avg_pool(padding):
    def theirs(x):
        window, strides = (1, 3, 3, 1), (1, 2, 2, 1)
        total = lax.reduce_window(x, 0.0, lax.add, window, strides, padding.upper())
        count = lax.reduce_window(jnp.ones_like(x), 0.0, lax.add, window, strides, padding.upper())
        return total / count
    compare(lambda x: conv_ops.avg_pool2d(x, 3, 2, padding), theirs, RNG.standard_normal((2, 7, 5, 3)))


@pytest.mark.parametrize("name, theirs", [
    ("relu", jax.nn.relu), ("sigmoid", jax.nn.sigmoid), ("tanh", jnp.tanh),
    ("gelu", lambda x: jax.nn.gelu(x, approximate=True)), ("softmax", jax.nn.softmax)])
def test_activations(name, theirs):
    compare(ops.activation(name), theirs, RNG.standard_normal((5, 6)) + 0.01)


def test_losses_and_normalization():
    labels = RNG.integers(0, 4, 6)
    targets = RNG.random((6, 4)).astype(np.float32)
    compare(lambda z: ops.softmax_cross_entropy(z, labels),
            lambda z: -jnp.mean(jax.nn.log_softmax(z)[jnp.arange(6), labels]), RNG.standard_normal((6, 4)))
    binary = (targets > 0.5).astype(np.float32)
    compare(lambda z: ops.sigmoid_cross_entropy(z, binary),
            lambda z: jnp.mean(-binary * jax.nn.log_sigmoid(z) - (1 - binary) * jax.nn.log_sigmoid(-z)),
            RNG.standard_normal((6, 4)))
    compare(lambda p: ops.huber(p, targets * 4), lambda p: jnp.mean(jnp.where(
        jnp.abs(p - targets * 4) <= 1, 0.5 * (p - targets * 4) ** 2, jnp.abs(p - targets * 4) - 0.5)),
        RNG.standard_normal((6, 4)))
    compare(lambda x: ops.normalize(x, (-1,), 1e-3)[0],
            lambda x: (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-3),
            RNG.standard_normal((5, 8)))
