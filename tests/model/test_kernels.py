"""The engine's ops backends: numba and CuPy against the numpy reference, op by op and through the
built-in MLP, the reference against finite differences, the model's input checks, and a short
training run on real MNIST digits."""

import gzip
import pathlib

import numpy as np
import pytest

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.inputs.datasets import MNIST_CSV
from zmqflow.models.registry import load_model
from zmqflow.common.optimizers import GradientDescent
from zmqflow.models.kernels import available_backends, get_backend

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


def assert_ops_match_reference(backend, activation, n, sizes=(784, 100, 10), dtype=np.float32):
    """Each op of `backend` against the numpy reference's, on host arrays in and out."""
    reference, kernels, rng = get_backend("numpy"), get_backend(backend), np.random.default_rng(n)
    tol = dict(rtol=2e-4, atol=2e-6) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-12)
    x, w = rng.random((n, sizes[0])).astype(dtype), (0.1 * rng.standard_normal(sizes[:2])).astype(dtype)
    b, g = (0.1 * rng.standard_normal(sizes[1])).astype(dtype), rng.standard_normal((n, sizes[1])).astype(dtype)
    labels = rng.integers(0, sizes[1], n)
    on, host = kernels.to_device, kernels.to_host
    for bias in (b, None):
        want = reference.dense(x, w, bias, activation)
        got = kernels.dense(on(x), on(w), None if bias is None else on(bias), activation)
        np.testing.assert_allclose(host(got), want, **tol)
        for need_dx, need_db in ((True, True), (False, False)):
            expected = reference.dense_grad(g, x, w, want, activation, need_dx, need_db)
            result = kernels.dense_grad(on(g), on(x), on(w), got, activation, need_dx, need_db)
            for e, r in zip(expected, result):
                assert (e is None) == (r is None)
                if e is not None:   # a sum over the batch: its float32 error scales with the largest term
                    scaled = dict(tol, atol=tol["atol"] * max(1.0, float(np.abs(e).max())))
                    np.testing.assert_allclose(host(r), e, **scaled)
    logits = on(x[:, :sizes[1]] * 5)
    want_loss, want_d, want_correct = reference.softmax_cross_entropy(host(logits), labels)
    loss, d, correct = kernels.softmax_cross_entropy(logits, labels)
    np.testing.assert_allclose(loss, want_loss, **tol)
    np.testing.assert_allclose(host(d), want_d, **tol)
    assert correct == want_correct == np.count_nonzero(host(logits).argmax(axis=1) == labels)
    np.testing.assert_allclose(host(kernels.softmax(logits)), reference.softmax(host(logits)), **tol)
    np.testing.assert_allclose(host(logits), x[:, :sizes[1]] * 5, **tol)   # the ops leave their inputs as they were


def assert_matches_reference(backend, activation, n, layers=(784, 100, 10), dtype="float32"):
    """The built-in MLP on `backend` against it on the numpy reference: loss, gradients, predictions."""
    reference, model = load_model(mlp_spec(activation, layers, dtype)), load_model(mlp_spec(activation, layers, dtype),
                                                                                    backend)
    params = random_params(reference)
    x, y = batch(n, layers[0], layers[-1], seed=n, dtype=dtype)
    tol = dict(rtol=2e-4, atol=2e-6) if dtype == "float32" else dict(rtol=1e-10, atol=1e-12)
    want_loss, want, _ = reference.step(params, (x, y))
    for _ in range(2):  # the second call runs on compiled kernels
        loss, grads, metrics = model.step(params, (x, y))
        np.testing.assert_allclose(loss, want_loss, **tol)
        assert grads.keys() == want.keys() == params.keys()
        for name in want:
            assert grads[name].shape == want[name].shape and grads[name].dtype == want[name].dtype
            np.testing.assert_allclose(grads[name], want[name], err_msg=name, **tol)
    probs = model.predict(params, x)
    assert isinstance(probs, np.ndarray)
    np.testing.assert_allclose(probs, reference.predict(params, x), **tol)
    np.testing.assert_allclose(probs.sum(axis=1), 1, rtol=1e-5)
    assert metrics["accuracy"] == np.mean(probs.argmax(axis=1) == y)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("n", [1, 7, 100])
def test_numba_ops_match_numpy(activation, n):
    assert_ops_match_reference("numba", activation, n)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("n", [1, 7, 100])
def test_numba_matches_numpy(activation, n):
    assert_matches_reference("numba", activation, n)


@pytest.mark.parametrize("activation", ["sigmoid", "relu"])
def test_numba_matches_numpy_deep_float64(activation):
    assert_ops_match_reference("numba", activation, 7, sizes=(12, 9), dtype=np.float64)
    assert_matches_reference("numba", activation, 7, layers=(12, 9, 6, 4), dtype="float64")


def test_numba_batch_sizes_interleaved():
    """Alternating batch sizes (the last, shorter batch of an epoch) must not mix up anything."""
    reference, model = load_model(mlp_spec()), load_model(mlp_spec(), "numba")
    params = reference.initial_values(1)
    for n in [7, 100, 7, 3, 5, 9, 11, 100]:
        x, y = batch(n, seed=n)
        np.testing.assert_allclose(model.step(params, (x, y))[0], reference.step(params, (x, y))[0], rtol=1e-5)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_reference_gradients_match_finite_differences(activation):
    model, rng = load_model(mlp_spec(activation, (5, 4, 3), "float64")), np.random.default_rng(5)
    params = {name: rng.standard_normal(value.shape) for name, value in model.initial_values().items()}
    x, y = rng.standard_normal((6, 5)), rng.integers(0, 3, 6)
    _, grads, _ = model.step(params, (x, y))
    eps = 1e-6
    for name, grad in grads.items():
        param, numeric = params[name], np.zeros_like(params[name])
        for idx in np.ndindex(param.shape):
            saved = param[idx]
            param[idx] = saved + eps
            plus = model.step(params, (x, y))[0]
            param[idx] = saved - eps
            minus = model.step(params, (x, y))[0]
            param[idx] = saved
            numeric[idx] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("label", [-1, 10])
def test_bad_labels_are_invalid_argument(backend, label):
    model = load_model(mlp_spec(), backend)
    x, y = batch(4)
    y[2] = label
    with pytest.raises(InvalidArgumentError, match=f"label value of {label}"):
        model.step(model.initial_values(1), (x, y))


def test_model_checks_params_and_batches():
    model = load_model(mlp_spec(), "numba")
    params = model.initial_values(1)
    x, y = batch(4)
    with pytest.raises(InvalidArgumentError, match="softmax/biases"):
        model.step({k: v for k, v in params.items() if k != "softmax/biases"}, (x, y))
    with pytest.raises(InvalidArgumentError, match="hidden/weights"):
        model.predict({**params, "hidden/weights": np.zeros((10, 100), np.float32)}, x)
    with pytest.raises(InvalidArgumentError, match=r"per-example shape \[10\], the model expects \[784\]"):
        model.predict(params, x[:, :10])
    with pytest.raises(InvalidArgumentError, match="labels"):
        model.step(params, (x, y[:3]))
    with pytest.raises(InvalidArgumentError, match="labels"):
        model.step(params, (x, y.astype(np.float32)))


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
    assert_ops_match_reference("cupy", activation, n)


@pytest.mark.gpu
def test_cupy_float64_and_bad_labels():
    require_gpu()
    assert_ops_match_reference("cupy", "tanh", 7, sizes=(12, 9), dtype=np.float64)
    kernels = get_backend("cupy")
    with pytest.raises(InvalidArgumentError, match="label value of 10"):
        kernels.softmax_cross_entropy(kernels.to_device(np.zeros((4, 10), np.float32)), np.array([0, 1, 10, 2]))


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
    start = model.step(params, (x, y))[0]
    for step in range(200):
        lo = (step * 100) % len(x)
        _, grads, _ = model.step(params, (x[lo:lo + 100], y[lo:lo + 100]))
        for name, grad in grads.items():
            sgd.apply_dense(params[name], grad, {}, step)
    end = model.step(params, (x, y))[0]
    accuracy = (model.predict(params, x).argmax(axis=1) == y).mean()
    assert start > 2.0 and end < 0.6 and accuracy > 0.85, (start, end, accuracy)


CHECKPOINT = pathlib.Path(__file__).parent / "data" / "mlp_checkpoint_before_the_engine" / "ckpt-42"


def test_a_checkpoint_of_the_mlp_before_the_engine_loads_and_answers_the_same():
    """Written by models/mlp.py (the fused kernels) before the MLP ran on the layer engine: the same
    variables, and the engine's predictions and loss from its values are what that MLP answered."""
    from zmqflow.common.checkpoints.checkpoint import Checkpoint
    checkpoint = Checkpoint(CHECKPOINT)
    model = load_model(checkpoint.config["model"], "numba")
    assert [(v.name, v.shape, v.dtype) for v in checkpoint.variables()] == sorted(
        (v.name, v.shape, v.dtype) for v in model.variables())
    params = {v.name: checkpoint.read(v.name)[0] for v in model.variables()}
    for name, value in model.initial_values().items():     # the seeds' first values, drawn the same way
        np.testing.assert_array_equal(value, params[name], err_msg=name)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_allclose(model.predict(params, x), [[0.18797601759433746, 0.2672295570373535, 0.5447943806648254],
                                                          [0.22414447367191315, 0.5240653157234192, 0.25179019570350647]],
                               rtol=1e-6)
    assert model.step(params, (x, np.array([0, 2])))[0] == pytest.approx(1.5253000259399414, rel=1e-6)
