"""MLP kernels: numba and CuPy against the numpy reference, the reference against finite
differences, the model's input checks, and a short training run on real MNIST digits."""

import gzip
import pathlib

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.inputs.datasets import MNIST_CSV
from zmqflow.models.registry import load_model
from zmqflow.services.ps.optimizers import GradientDescent
from zmqflow.models.kernels import available_backends, get_backend
from zmqflow.models.kernels.numpy_kernels import Kernels as NumpyKernels

pytestmark = pytest.mark.unit

ACTIVATIONS = ["sigmoid", "relu", "tanh", "none"]
DATA = pathlib.Path(MNIST_CSV)


def mlp_spec(activation="sigmoid", layers=(784, 100, 10), dtype="float32"):
    return {"type": "mlp", "layers": list(layers), "activation": activation,
            "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1, "dtype": dtype}


def batch(n, n_in=784, classes=10, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.random((n, n_in)).astype(dtype), rng.integers(0, classes, n)


def random_params(model, seed=3):
    """Initial weights with random biases too, so bias gradients and relu kinks get exercised."""
    rng = np.random.default_rng(seed)
    params = model.initial_values(1)
    for name, value in params.items():
        if name.endswith("/biases"):
            params[name] = (0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
    return params


def assert_matches_reference(backend, activation, n, layers=(784, 100, 10), dtype="float32"):
    reference, model = load_model(mlp_spec(activation, layers, dtype)), load_model(mlp_spec(activation, layers, dtype),
                                                                                    backend)
    params = random_params(reference)
    x, y = batch(n, layers[0], layers[-1], seed=n, dtype=dtype)
    tol = dict(rtol=2e-4, atol=2e-6) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    want_loss, want = reference.loss_and_gradients(params, x, y)
    for _ in range(2):  # the second call runs on reused scratch buffers
        loss, grads = model.loss_and_gradients(params, x, y)
        np.testing.assert_allclose(loss, want_loss, **tol)
        assert grads.keys() == want.keys()
        for name in want:
            assert grads[name].shape == want[name].shape and grads[name].dtype == want[name].dtype
            np.testing.assert_allclose(grads[name], want[name], err_msg=name, **tol)
    probs = model.predict(params, x)
    assert isinstance(probs, np.ndarray)
    np.testing.assert_allclose(probs, reference.predict(params, x), **tol)
    np.testing.assert_allclose(probs.sum(axis=1), 1, rtol=1e-5)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("n", [1, 7, 100])
def test_numba_matches_numpy(activation, n):
    assert_matches_reference("numba", activation, n)


@pytest.mark.parametrize("activation", ["sigmoid", "relu"])
def test_numba_matches_numpy_deep_float64(activation):
    assert_matches_reference("numba", activation, 7, layers=(12, 9, 6, 4), dtype="float64")


def test_numba_batch_sizes_interleaved():
    """Scratch buffers are per batch size: alternating sizes must not mix them up."""
    reference, model = load_model(mlp_spec()), load_model(mlp_spec(), "numba")
    params = reference.initial_values(1)
    for n in [7, 100, 7, 3, 5, 9, 11, 100]:
        x, y = batch(n, seed=n)
        np.testing.assert_allclose(model.loss_and_gradients(params, x, y)[0],
                                   reference.loss_and_gradients(params, x, y)[0], rtol=1e-5)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_gradients_into_out(backend):
    model = load_model(mlp_spec(), backend)
    params = model.initial_values(1)
    x, y = batch(10)
    out = {name: np.empty_like(value) for name, value in params.items()}
    loss, grads = model.loss_and_gradients(params, x, y, out=out)
    _, fresh = model.loss_and_gradients(params, x, y)
    for name in out:
        assert grads[name] is out[name]
        np.testing.assert_allclose(out[name], fresh[name], rtol=1e-6)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_reference_gradients_match_finite_differences(activation):
    kernels, rng = NumpyKernels(), np.random.default_rng(5)
    sizes = [5, 4, 3]
    weights = [rng.standard_normal((a, b)) for a, b in zip(sizes[:-1], sizes[1:])]
    biases = [rng.standard_normal(b) for b in sizes[1:]]
    x, y = rng.standard_normal((6, 5)), rng.integers(0, 3, 6)
    _, grads_w, grads_b = kernels.loss_and_gradients(weights, biases, x, y, activation)
    eps = 1e-6
    for param, grad in zip(weights + biases, grads_w + grads_b):
        numeric = np.zeros_like(param)
        for idx in np.ndindex(param.shape):
            saved = param[idx]
            param[idx] = saved + eps
            plus = kernels.loss_and_gradients(weights, biases, x, y, activation)[0]
            param[idx] = saved - eps
            minus = kernels.loss_and_gradients(weights, biases, x, y, activation)[0]
            param[idx] = saved
            numeric[idx] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("label", [-1, 10])
def test_bad_labels_are_invalid_argument(backend, label):
    model = load_model(mlp_spec(), backend)
    x, y = batch(4)
    y[2] = label
    with pytest.raises(InvalidArgumentError, match=f"label value of {label}"):
        model.loss_and_gradients(model.initial_values(1), x, y)


def test_model_checks_params_and_batches():
    model = load_model(mlp_spec(), "numba")
    params = model.initial_values(1)
    x, y = batch(4)
    with pytest.raises(InvalidArgumentError, match="softmax/biases"):
        model.loss_and_gradients({k: v for k, v in params.items() if k != "softmax/biases"}, x, y)
    with pytest.raises(InvalidArgumentError, match="hidden/weights"):
        model.predict({**params, "hidden/weights": np.zeros((10, 100), np.float32)}, x)
    with pytest.raises(InvalidArgumentError, match="inputs"):
        model.predict(params, x[:, :10])
    with pytest.raises(InvalidArgumentError, match="labels"):
        model.loss_and_gradients(params, x, y[:3])
    with pytest.raises(InvalidArgumentError, match="labels"):
        model.loss_and_gradients(params, x, y.astype(np.float32))


def test_backend_selection():
    assert available_backends()[:2] == ["numpy", "numba"]
    assert get_backend("numba").name == "numba"
    with pytest.raises(InvalidArgumentError, match="unknown kernel backend 'tpu'"):
        get_backend("tpu")
    if "cupy" not in available_backends():
        with pytest.raises(InvalidArgumentError, match="needs a GPU"):
            get_backend("cupy")


def require_gpu():
    cupy = pytest.importorskip("cupy")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        count = 0
    if count == 0:
        pytest.skip("no CUDA device")


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("n", [1, 7, 100])
def test_cupy_matches_numpy(activation, n):
    require_gpu()
    assert_matches_reference("cupy", activation, n)


@pytest.mark.gpu
def test_cupy_float64_and_bad_labels():
    require_gpu()
    assert_matches_reference("cupy", "tanh", 7, layers=(12, 9, 6, 4), dtype="float64")
    model = load_model(mlp_spec(), "cupy")
    x, y = batch(4)
    y[0] = 10
    with pytest.raises(InvalidArgumentError, match="label value of 10"):
        model.loss_and_gradients(model.initial_values(1), x, y)


@pytest.fixture(scope="module")
def mnist():
    """The 5,000 digits, pixels scaled to [0, 1], rows shuffled with a fixed seed (the file is sorted by label)."""
    with gzip.open(DATA, "rb") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.uint8)
    rows = rows[np.random.default_rng(0).permutation(len(rows))]
    return (rows[:, :784] / np.float32(255)).astype(np.float32), rows[:, 784].astype(np.int64)


def test_sgd_training_reduces_mnist_loss(mnist):
    x, y = mnist
    model = load_model(mlp_spec(), "numba")
    params, sgd = model.initial_values(1), GradientDescent(0.5)
    start = model.loss_and_gradients(params, x, y)[0]
    for step in range(200):
        lo = (step * 100) % len(x)
        _, grads = model.loss_and_gradients(params, x[lo:lo + 100], y[lo:lo + 100])
        for name, grad in grads.items():
            sgd.apply_dense(params[name], grad, {}, step)
    end = model.loss_and_gradients(params, x, y)[0]
    accuracy = (model.predict(params, x).argmax(axis=1) == y).mean()
    assert start > 2.0 and end < 0.6 and accuracy > 0.85, (start, end, accuracy)
