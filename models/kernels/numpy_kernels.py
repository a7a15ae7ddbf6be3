"""The numpy backend of the engine's ops: the readable reference that the numba and CuPy backends
are tested against. It allocates freely; speed is not its job.

A backend is a table of the ops that pay to be written per device (tinygrad's ops_cpu): every
backend module has a `Kernels` class with the same methods, which zmqflow.models.ops wraps as
differentiable ops (each forward there with its backward beside it):

- `dense(x, w, b, activation)`: f(x @ w + b) for x [rows, n], w [n, m], b [m] or None;
- `dense_grad(g, x, w, y, activation, need_dx, need_db)`: (dx or None, dw, db or None) from
  g = d loss / d y, where y = dense(...), the activation's derivative taken from its output;
- `softmax_cross_entropy(logits, labels)`: (mean cross-entropy of integer class ids as a
  float, d loss / d logits, how many rows' largest logit is their label's), in one pass;
- `softmax(logits)`: row-wise probabilities;
- `to_device(array, dtype=None)` / `to_host(array)`: into and out of the backend's memory.

Activations: "sigmoid", "relu", "tanh", "none". The tables below are written with ufuncs, so
they also hold for CuPy arrays (ops.py's elementwise activations use them on any device).
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError

ACTIVATIONS = {
    "sigmoid": lambda z: 1 / (1 + np.exp(-z)),
    "relu": lambda z: np.maximum(z, 0),
    "tanh": np.tanh,
    "none": lambda z: z,
}

# Derivative of each activation written in terms of its output y = f(z).
DERIVATIVES = {
    "sigmoid": lambda y: y * (1 - y),
    "relu": lambda y: (y > 0).astype(y.dtype),
    "tanh": lambda y: 1 - y * y,
}


def check_labels(y, classes):
    """TF's error for a label that is not a class id (numpy would wrap -1 silently)."""
    bad = (y < 0) | (y >= classes)
    if bad.any():
        raise InvalidArgumentError(
            f"Received a label value of {y[bad][0]} which is outside the valid range of [0, {classes}).")


class Kernels:
    """The numpy backend (see the module docstring for the shared interface)."""

    name = "numpy"
    device = None     # host memory: numpy and numba arrays move between them without a copy

    def to_device(self, array, dtype=None):
        return np.ascontiguousarray(array, dtype=dtype)

    def to_host(self, array):
        return np.asarray(array)

    def dense(self, x, w, b, activation):
        z = x @ w
        return ACTIVATIONS[activation](z if b is None else z + b).astype(z.dtype, copy=False)

    def dense_grad(self, g, x, w, y, activation, need_dx, need_db):
        d = g if activation == "none" else g * DERIVATIVES[activation](y)
        return d @ w.T if need_dx else None, x.T @ d, d.sum(axis=0) if need_db else None

    def softmax_cross_entropy(self, logits, labels):
        check_labels(labels, logits.shape[1])
        n, rows = logits.shape[0], np.arange(logits.shape[0])
        shifted = logits - logits.max(axis=1, keepdims=True)
        e = np.exp(shifted)
        total = e.sum(axis=1, keepdims=True)
        loss = float(np.mean(np.log(total[:, 0]) - shifted[rows, labels]))
        correct = int(np.count_nonzero(logits.argmax(axis=1) == labels))
        d = e / total
        d[rows, labels] -= 1
        return loss, d / n, correct

    def softmax(self, logits):
        e = np.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
