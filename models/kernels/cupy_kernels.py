"""The CuPy backend of the engine's ops (interface: numpy_kernels): cuBLAS matmuls (`@`),
fused elementwise kernels.

Same structure as the numba backend: one elementwise kernel for bias add + activation,
one for upstream gradient * activation derivative, and the softmax cross-entropy
gradient in one kernel after two row reductions; bias gradients are column sums.

CuPy is imported only when a `Kernels` object is made, so this module imports on
machines without CuPy; `gpu_count()` says whether one can be made. Arrays live on the
GPU the `Kernels` object was made for (CuPy's current device by default).
"""

import functools

import numpy as np

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.kernels.numpy_kernels import check_labels

_ACTIVATION = {  # y = f(z + b)
    "sigmoid": "y = (T)1 / ((T)1 + exp(-(z + b)));",
    "relu": "y = max(z + b, (T)0);",
    "tanh": "y = tanh(z + b);",
    "none": "y = z + b;",
}
_DERIVATIVE = {  # d = g * f'(z), from the output a = f(z)
    "sigmoid": "d = g * a * ((T)1 - a);",
    "relu": "d = a > (T)0 ? g : (T)0;",
    "tanh": "d = g * ((T)1 - a * a);",
}


def _import_cupy():
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        raise InvalidArgumentError(f"kernel backend 'cupy' is not available: {exc}") from exc
    return cupy


def gpu_count():
    """The number of CUDA devices CuPy can use; 0 without CuPy, a driver or a GPU."""
    try:
        return _import_cupy().cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def why_no_gpu():
    """A short reason for gpu_count() == 0, for error messages."""
    try:
        cupy = _import_cupy()
        count = cupy.cuda.runtime.getDeviceCount()
        return f"CuPy sees {count} CUDA devices"
    except Exception as exc:
        return f"CuPy cannot use a GPU here ({exc})"


@functools.cache
def _kernels():
    """The compiled-on-first-use elementwise kernels, one per activation."""
    cupy = _import_cupy()
    bias_act = {name: cupy.ElementwiseKernel("T z, T b", "T y", body, f"zmqflow_bias_{name}")
                for name, body in _ACTIVATION.items()}
    act_grad = {name: cupy.ElementwiseKernel("T a, T g", "T d", body, f"zmqflow_grad_{name}")
                for name, body in _DERIVATIVE.items()}
    exp_shift = cupy.ElementwiseKernel("T top", "T z", "z = exp(z - top);", "zmqflow_exp_shift")
    xent_grad = cupy.ElementwiseKernel(
        "T total, raw L labels, int32 classes, T scale", "T p",
        "p = (p / total - (labels[i / classes] == i % classes ? (T)1 : (T)0)) * scale;",
        "zmqflow_xent_grad")
    return bias_act, act_grad, exp_shift, xent_grad


_COL2IM = """
int ch = i % c, rest = i / c;
int x = rest % w; rest /= w;
int y = rest % h; int b = rest / h;
T sum = out;
for (int ki = 0; ki < kh; ++ki) {
    int dy = y - ki;
    if (dy < 0 || dy % stride != 0 || dy / stride >= oh) continue;
    for (int kj = 0; kj < kw; ++kj) {
        int dx = x - kj;
        if (dx < 0 || dx % stride != 0 || dx / stride >= ow) continue;
        sum += windows[((((long long)(b * oh + dy / stride) * ow + dx / stride) * kh + ki) * kw + kj) * c + ch];
    }
}
out = sum;
"""


@functools.cache
def _col2im_kernel():
    return _import_cupy().ElementwiseKernel(
        "raw T windows, int32 oh, int32 ow, int32 kh, int32 kw, int32 c, int32 h, int32 w, int32 stride", "T out",
        _COL2IM, "zmqflow_col2im")


def col2im(grad_windows, out, stride):
    """Add grad_windows [n, oh, ow, kh, kw, c] (C-contiguous) onto out [n, h, w, c] (the padded input) in place:
    conv2d's input gradient in one launch, a thread per input element gathering the windows that cover it, in
    the (kh, kw) order of the reference's loop (numpy_kernels' caller, models/conv_ops.py)."""
    n, oh, ow, kh, kw, c = grad_windows.shape
    _col2im_kernel()(grad_windows, oh, ow, kh, kw, c, out.shape[1], out.shape[2], stride, out)
    return out


_MAX_POOL_GRAD = """
int ch = i % c, rest = i / c;
int x = rest % w; rest /= w;
int y = rest % h; int b = rest / h;
int oy = y / size, ox = x / size;
long long o = (((long long)b * (h / size) + oy) * (w / size) + ox) * c + ch;
int first = -1;
for (int k = 0; k < size * size && first < 0; ++k) {
    if (input[(((long long)b * h + oy * size + k / size) * w + ox * size + k % size) * c + ch] == top[o]) first = k;
}
out = first == (y - oy * size) * size + (x - ox * size) ? grad[o] : (T)0;
"""


@functools.cache
def _max_pool_grad_kernel():
    return _import_cupy().ElementwiseKernel(
        "raw T input, raw T top, raw T grad, int32 h, int32 w, int32 c, int32 size", "T out",
        _MAX_POOL_GRAD, "zmqflow_max_pool_grad")


def max_pool_grad_tiles(x, top, g, size):
    """The gradient of a max pool over exact size x size tiles of x [n, h, w, c] (C-contiguous), in one launch:
    each window's gradient goes to its first maximum in row-major order, as the reference (models/conv_ops.py's
    loop) and TensorFlow's MaxPoolGrad route it; a window holding NaN passes none."""
    xp = _import_cupy()
    n, h, w, c = x.shape
    out = xp.empty_like(x)
    _max_pool_grad_kernel()(x, xp.ascontiguousarray(top), xp.ascontiguousarray(g, dtype=x.dtype), h, w, c, size,
                            out)
    return out


class Kernels:
    """The CuPy backend (interface: see numpy_kernels) on GPU `index` (None: CuPy's current device).
    Every op runs with its GPU current, so layers on several GPUs compute each on its own."""

    name = "cupy"

    def __init__(self, index=None):
        self.xp = _import_cupy()
        self.index = self.xp.cuda.runtime.getDevice() if index is None else index
        self.device = ("GPU", self.index)
        self._bias_act, self._act_grad, self._exp_shift, self._xent_grad = _kernels()

    def current(self):
        """CuPy's `with` scope that makes this GPU current."""
        return self.xp.cuda.Device(self.index)

    def to_device(self, array, dtype=None):
        with self.current():
            return self.xp.ascontiguousarray(self.xp.asarray(array, dtype=dtype))

    def to_host(self, array):
        with self.current():
            return array.get()

    def dense(self, x, w, b, activation):
        with self.current():
            z = x @ w
            return self._bias_act[activation](z, 0 if b is None else b, z)

    def dense_grad(self, g, x, w, y, activation, need_dx, need_db):
        with self.current():
            d = g if activation == "none" else self._act_grad[activation](y, g, self.xp.empty_like(g))
            return d @ w.T if need_dx else None, x.T @ d, d.sum(axis=0) if need_db else None

    def softmax_cross_entropy(self, logits, labels):
        xp, (n, classes) = self.xp, logits.shape
        if isinstance(labels, np.ndarray):  # checked on the host, before the copy, without a device sync
            check_labels(labels, classes)
        with self.current():
            labels = xp.asarray(labels)
            d = logits.copy()
            top = d.max(axis=1, keepdims=True)
            picked = d[xp.arange(n), labels]
            self._exp_shift(top, d)
            total = d.sum(axis=1, keepdims=True)
            loss = xp.mean(xp.log(total[:, 0]) + top[:, 0] - picked)
            correct = xp.count_nonzero(logits.argmax(axis=1) == labels)
            self._xent_grad(total, labels, np.int32(classes), d.dtype.type(1.0 / n), d)
            loss, correct = xp.stack([loss.astype(xp.float64), correct.astype(xp.float64)]).get()   # one wait
            return float(loss), d, int(correct)

    def softmax(self, logits):
        with self.current():
            probs = logits.copy()
            self._exp_shift(probs.max(axis=1, keepdims=True), probs)
            probs /= probs.sum(axis=1, keepdims=True)
            return probs
