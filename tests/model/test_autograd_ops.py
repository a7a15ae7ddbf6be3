"""Every differentiable op's backward against central finite differences (float64)."""

import numpy as np
import pytest

from zmqflow.models import conv_ops, ops
from zmqflow.models.autograd import constant, unbroadcast, variable
from tests.model.gradients import numeric_gradient

pytestmark = pytest.mark.unit

RNG = np.random.default_rng(0)


def check(build, *shapes, tolerance=1e-6, values=None):
    """build(*tensors) -> tensor; its sum's autograd gradient per input against finite differences."""
    arrays = values or [RNG.standard_normal(s) for s in shapes]
    weights = None

    def loss_value():
        nonlocal weights
        out = build(*[constant(a) for a in arrays]).value
        if weights is None:
            weights = RNG.standard_normal(np.shape(out))
        return float((out * weights).sum())

    loss_value()
    tensors = [variable(a.copy()) for a in arrays]
    out = build(*tensors)
    out.backward(weights * np.ones_like(out.value))
    for i, (array, tensor) in enumerate(zip(arrays, tensors)):
        expected = numeric_gradient(loss_value, array)
        assert tensor.grad is not None, f"input {i} got no gradient"
        np.testing.assert_allclose(tensor.grad, expected, rtol=tolerance, atol=tolerance, err_msg=f"input {i}")


def test_arithmetic_with_broadcasting():
    check(ops.add, (4, 3), (3,))
    check(ops.mul, (4, 3), (1, 3))
    for activation in ("none", "sigmoid", "relu", "tanh"):   # dense: the fused matmul + bias + activation
        check(lambda x, w, b: ops.dense(x, w, b, activation), (5, 4), (4, 3), (3,))
        check(lambda x, w: ops.dense(x, w, None, activation), (2, 5, 4), (4, 3))
    check(lambda a: ops.reshape(a, (3, 8)), (4, 6))
    check(lambda a, b: ops.concat([a, b]), (4, 2), (4, 3))
    check(ops.mean, (3, 5))
    assert unbroadcast(np.ones((4, 3)), (1, 3)).tolist() == [[4.0, 4.0, 4.0]]


@pytest.mark.parametrize("name", ["relu", "sigmoid", "tanh", "gelu", "softmax"])
def test_activations(name):
    values = [RNG.standard_normal((4, 5)) + 0.05]   # keep relu away from its kink at 0
    check(ops.activation(name), values=values)


def test_normalize_and_embedding_and_dropout():
    check(lambda a: ops.normalize(a, (0,), 1e-3)[0], (6, 3))
    check(lambda a: ops.normalize(a, (-1,), 1e-3)[0], (4, 5))
    ids = np.array([[0, 2], [2, 3]])
    check(lambda t: ops.gather_rows(t, ids), (5, 3))
    rng_state = np.random.default_rng(7)
    masks = []

    def dropped(a):
        out = ops.dropout(a, 0.5, np.random.default_rng(7))
        masks.append(out.value)
        return out
    check(dropped, (4, 6))
    assert (masks[0] == 0).any() and rng_state is not None


@pytest.mark.parametrize("loss", ["softmax", "sigmoid", "mse", "huber"])
def test_losses(loss):
    labels = np.array([0, 2, 1, 2])
    targets = RNG.random((4, 3))
    builds = {"softmax": lambda x: ops.softmax_cross_entropy(x, labels),
              "sigmoid": lambda x: ops.sigmoid_cross_entropy(x, (targets > 0.5).astype(float)),
              "mse": lambda x: ops.mean_squared_error(x, targets),
              "huber": lambda x: ops.huber(x, targets * 3, delta=1.0)}
    check(builds[loss], (4, 3))


def test_softmax_cross_entropy_value_is_tensorflows():
    logits = np.array([[2.0, 1.0, 0.1], [0.5, 2.5, 0.0]])
    value = ops.softmax_cross_entropy(constant(logits), np.array([0, 1])).value
    log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    assert value == pytest.approx(-(log_p[0, 0] + log_p[1, 1]) / 2)


@pytest.mark.parametrize("stride, padding", [(1, "valid"), (1, "same"), (2, "same"), (2, "valid")])
def test_conv2d(stride, padding):
    check(lambda x, k: conv_ops.conv2d(x, k, stride, padding), (2, 6, 5, 3), (3, 3, 3, 4))


def test_conv2d_equals_a_direct_loop():
    x, k = RNG.standard_normal((1, 5, 5, 2)), RNG.standard_normal((3, 3, 2, 4))
    out = conv_ops.conv2d(constant(x), constant(k), 1, "valid").value
    direct = np.zeros((1, 3, 3, 4))
    for i in range(3):
        for j in range(3):
            direct[0, i, j] = np.einsum("abc,abcd->d", x[0, i:i + 3, j:j + 3], k)
    np.testing.assert_allclose(out, direct, rtol=1e-12)
    assert conv_ops.output_size(28, 5, 1, "same") == (28, (2, 2))
    assert conv_ops.output_size(7, 2, 2, "same") == (4, (0, 1))


@pytest.mark.parametrize("pool", ["max", "avg"])
@pytest.mark.parametrize("size, stride, padding", [(2, None, "valid"), (2, None, "same"), (3, 2, "same"), (3, 1, "valid")])
def test_pooling(pool, size, stride, padding):
    op = conv_ops.max_pool2d if pool == "max" else conv_ops.avg_pool2d
    check(lambda x: op(x, size, stride, padding), (2, 5, 7, 3))


def test_avg_pool_same_padding_counts_only_real_pixels():
    x = np.ones((1, 3, 3, 1))
    out = conv_ops.avg_pool2d(constant(x), 2, None, "same").value
    assert np.allclose(out, 1.0)   # the padded corner is not averaged in as zeros


@pytest.mark.parametrize("pool", ["max", "avg"])
@pytest.mark.parametrize("padding", ["valid", "same"])
def test_tiled_pooling_equals_the_window_path(pool, padding):
    """2x2 pools of even images take the tiled path; it must agree with the general one, ties included."""
    op = conv_ops.max_pool2d if pool == "max" else conv_ops.avg_pool2d
    x = np.maximum(RNG.standard_normal((2, 6, 4, 3)), 0.0)           # relu output: many tied zeros
    g = RNG.standard_normal((2, 3, 2, 3))
    tiled = variable(x.copy())
    out = op(tiled, 2, 2, padding)
    out.backward(g)
    general = variable(x.copy())
    reference = op(general, 2, 1, padding)   # stride 1 takes the window path; keep every other window
    picked = reference.value[:, ::2, ::2, :][:, :3, :2, :]
    np.testing.assert_allclose(out.value, picked)
    check(lambda t: op(t, 2, 2, padding), (2, 6, 4, 3))
    assert conv_ops._tiles(x, 2, 2, padding) is not None and conv_ops._tiles(x, 2, 1, padding) is None


def test_max_pool_gradient_goes_to_the_first_of_tied_maxima():
    x = variable(np.zeros((1, 2, 2, 1)))
    conv_ops.max_pool2d(x, 2).backward(np.ones((1, 1, 1, 1)))
    assert x.grad.ravel().tolist() == [1.0, 0.0, 0.0, 0.0]


def test_numba_col2im_equals_the_numpy_loop():
    from zmqflow.models.kernels.numba_kernels import col2im
    windows = RNG.standard_normal((3, 4, 5, 3, 2, 6)).astype(np.float32)
    for stride in (1, 2):
        shape = (3, (4 - 1) * stride + 3, (5 - 1) * stride + 2, 6)
        expected = np.zeros(shape, np.float32)
        for i in range(3):
            for j in range(2):
                expected[:, i:i + stride * 4:stride, j:j + stride * 5:stride, :] += windows[:, :, :, i, j, :]
        out = np.zeros(shape, np.float32)
        col2im(windows, out, stride)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)   # summation order differs


@pytest.mark.gpu
def test_cupy_col2im_equals_the_numpy_loop():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'zmqflow[gpu]')")
    from zmqflow.models.kernels import gpu_count
    from zmqflow.models.kernels.cupy_kernels import col2im
    if gpu_count() == 0:
        pytest.skip("no GPU is visible")
    windows = RNG.standard_normal((3, 4, 5, 3, 2, 6)).astype(np.float32)
    for stride in (1, 2, 3):
        shape = (3, (4 - 1) * stride + 3 + 1, (5 - 1) * stride + 2, 6)   # a row no window covers stays zero
        expected = np.zeros(shape, np.float32)
        for i in range(3):
            for j in range(2):
                expected[:, i:i + stride * 4:stride, j:j + stride * 5:stride, :] += windows[:, :, :, i, j, :]
        out = cupy.zeros(shape, cupy.float32)
        col2im(cupy.asarray(windows), out, stride)
        np.testing.assert_allclose(out.get(), expected, rtol=1e-6, atol=1e-7)   # the loop's order: equal


@pytest.mark.gpu
def test_cupy_max_pool_gradient_equals_the_numpy_loop():
    """Ties go to the first maximum in row-major order, a window holding NaN passes no gradient: as on the CPU."""
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'zmqflow[gpu]')")
    from zmqflow.models.kernels import gpu_count
    if gpu_count() == 0:
        pytest.skip("no GPU is visible")
    x = RNG.integers(0, 3, (2, 6, 12, 5)).astype(np.float32)      # small integers: many ties
    x[0, 0, 0, 0] = np.nan
    for size in (2, 3):
        g = RNG.standard_normal((2, 6 // size, 12 // size, 5)).astype(np.float32)
        cpu = variable(x)
        conv_ops.max_pool2d(cpu, size).backward(g)
        gpu = variable(cupy.asarray(x))
        conv_ops.max_pool2d(gpu, size).backward(cupy.asarray(g))
        np.testing.assert_array_equal(gpu.grad.get(), cpu.grad)


@pytest.mark.parametrize("stride", [1, 2, 3])
@pytest.mark.parametrize("padding", ["same", "valid"])
def test_strided_windows_equal_numpys_pad_and_sliding_window_view(stride, padding):
    """The windows CuPy's path makes by strides (conv_ops._strided_windows), checked with numpy against the
    path numpy takes: the same padded input and the same [n, oh, ow, c, kh, kw] view, also of a strided input."""
    base = RNG.standard_normal((2, 9, 3, 8)).astype(np.float32)
    for x in (base[..., :7].copy(), base.transpose(0, 3, 1, 2)[:, :, ::2, :]):      # contiguous, and not
        for kh, kw, fill in ((3, 2, 0.0), (5, 5, -np.inf), (1, 1, 0.0)):
            if padding == "valid" and (x.shape[1] < kh or x.shape[2] < kw):
                continue
            want_padded, want_view, want_pads = conv_ops._windows(x, kh, kw, stride, padding, fill)
            oh, pad_h = conv_ops.output_size(x.shape[1], kh, stride, padding)
            ow, pad_w = conv_ops.output_size(x.shape[2], kw, stride, padding)
            padded, view, pads = conv_ops._strided_windows(x, kh, kw, stride, (oh, ow), (pad_h, pad_w), fill, np)
            assert pads == want_pads and view.shape == want_view.shape
            np.testing.assert_array_equal(padded, want_padded)
            np.testing.assert_array_equal(view, want_view)


@pytest.mark.gpu
def test_cupy_convolution_and_pools_with_padding_and_strides_equal_numpys():
    """conv2d, max_pool2d and avg_pool2d on CuPy arrays (their windows made by conv_ops._strided_windows) against
    numpy's, forward and backward, with 'same' padding and strides that are not the window's."""
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'zmqflow[gpu]')")
    from zmqflow.models.kernels import gpu_count
    if gpu_count() == 0:
        pytest.skip("no GPU is visible")
    TOL = dict(rtol=1e-4, atol=1e-4)     # float32 sums in other orders; a wrong window is off by O(1)
    x = RNG.standard_normal((2, 9, 7, 3)).astype(np.float32)
    kernel = RNG.standard_normal((3, 3, 3, 4)).astype(np.float32)
    cases = [(lambda a, k: conv_ops.conv2d(a, k, 2, "same"), True),
             (lambda a, k: conv_ops.conv2d(a, k, 1, "valid"), True),
             (lambda a, k: conv_ops.max_pool2d(a, 3, 2, "same"), False),
             (lambda a, k: conv_ops.avg_pool2d(a, 3, 2, "same"), False)]
    for op, uses_kernel in cases:
        cpu_x, cpu_k = variable(x), variable(kernel)
        gpu_x, gpu_k = variable(cupy.asarray(x)), variable(cupy.asarray(kernel))
        want, got = op(cpu_x, cpu_k), op(gpu_x, gpu_k)
        np.testing.assert_allclose(cupy.asnumpy(got.value), want.value, **TOL)
        g = RNG.standard_normal(want.shape).astype(np.float32)
        want.backward(g)
        got.backward(cupy.asarray(g))
        np.testing.assert_allclose(cupy.asnumpy(gpu_x.grad), cpu_x.grad, **TOL)
        if uses_kernel:
            np.testing.assert_allclose(cupy.asnumpy(gpu_k.grad), cpu_k.grad, **TOL)
