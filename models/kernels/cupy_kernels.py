"""GPU kernels of the MLP with CuPy: cuBLAS matmuls (`@`), fused elementwise kernels.

Same structure as the numba backend: one elementwise kernel for bias add + activation,
one for upstream gradient * activation derivative, and the softmax cross-entropy
gradient in one kernel after two row reductions; bias gradients are column sums.

CuPy is imported only when a `Kernels` object is made, so this module imports on
machines without CuPy; `gpu_count()` says whether one can be made. Arrays live on the
current CuPy device (choose it with CUDA_VISIBLE_DEVICES or `cupy.cuda.Device(i).use()`).
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
_DERIVATIVE = {  # d *= f'(z), from the output a = f(z)
    "sigmoid": "d *= a * ((T)1 - a);",
    "relu": "if (a <= (T)0) d = (T)0;",
    "tanh": "d *= (T)1 - a * a;",
    "none": "",
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
    act_grad = {name: cupy.ElementwiseKernel("T a", "T d", body, f"zmqflow_grad_{name}")
                for name, body in _DERIVATIVE.items() if body}
    exp_shift = cupy.ElementwiseKernel("T top", "T z", "z = exp(z - top);", "zmqflow_exp_shift")
    xent_grad = cupy.ElementwiseKernel(
        "T total, raw L labels, int32 classes, T scale", "T p",
        "p = (p / total - (labels[i / classes] == i % classes ? (T)1 : (T)0)) * scale;",
        "zmqflow_xent_grad")
    return bias_act, act_grad, exp_shift, xent_grad


class Kernels:
    """The CuPy backend (interface: see numpy_kernels). Not thread-safe: one per thread."""

    name = "cupy"

    def __init__(self):
        self.xp = _import_cupy()
        self._bias_act, self._act_grad, self._exp_shift, self._xent_grad = _kernels()

    def to_device(self, array, dtype):
        return self.xp.ascontiguousarray(self.xp.asarray(array, dtype=dtype))

    def to_host(self, array, out=None):
        return array.get(out=out) if out is not None else array.get()

    def _forward(self, weights, biases, x, activation):
        hidden = [x]
        for w, b in zip(weights[:-1], biases[:-1]):
            z = hidden[-1] @ w
            hidden.append(self._bias_act[activation](z, b, z))
        logits = hidden[-1] @ weights[-1]
        return hidden, self._bias_act["none"](logits, biases[-1], logits)

    def predict(self, weights, biases, x, activation):
        logits = self._forward(weights, biases, x, activation)[1]
        self._exp_shift(logits.max(axis=1, keepdims=True), logits)
        logits /= logits.sum(axis=1, keepdims=True)
        return logits

    def loss_and_gradients(self, weights, biases, x, y, activation, out=None):
        xp, n, classes = self.xp, x.shape[0], weights[-1].shape[1]
        if isinstance(y, np.ndarray):  # checked on the host, before the copy, without a device sync
            check_labels(y, classes)
        y = xp.asarray(y)
        hidden, d = self._forward(weights, biases, x, activation)
        top = d.max(axis=1, keepdims=True)
        picked = d[xp.arange(n), y]
        self._exp_shift(top, d)
        total = d.sum(axis=1, keepdims=True)
        loss = float(xp.mean(xp.log(total[:, 0]) + top[:, 0] - picked))
        self._xent_grad(total, y, np.int32(classes), d.dtype.type(1.0 / n), d)
        grads_w, grads_b = out if out is not None else ([None] * len(weights), [None] * len(biases))
        for i in range(len(weights) - 1, -1, -1):
            grads_w[i] = xp.matmul(hidden[i].T, d, out=grads_w[i])
            grads_b[i] = xp.sum(d, axis=0, out=grads_b[i])
            if i > 0:
                d = d @ weights[i].T
                if activation != "none":
                    self._act_grad[activation](hidden[i], d)
        return loss, grads_w, grads_b
