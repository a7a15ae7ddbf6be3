"""CPU kernels of the MLP: BLAS for the matmuls, numba to fuse the elementwise work.

Numba loops reach a fraction of BLAS's speed on matmuls, so every matmul stays a numpy
`np.dot(..., out=...)` into a reused buffer; numba does, in one pass each:
- bias add + activation, in place on the matmul's output;
- softmax + cross-entropy + its gradient + the last bias gradient;
- upstream gradient * activation derivative + that layer's bias gradient (column sums).

Scratch buffers are kept per (batch size, dtype, layer widths), so a step allocates
nothing but the returned gradients (and not those when `out=` is given). The kernels are
serial: with 2 threads, `parallel=True` saved 3.5 us of a ~380 us step (batch 100) on the
sigmoid and nothing elsewhere, below run-to-run noise, and the launcher gives each
computing process one thread anyway. A `Kernels` object is not thread-safe: one per thread.
"""

import math
from collections import OrderedDict

import numpy as np
from numba import njit, prange

from zmqflow.models.kernels.numpy_kernels import check_labels

SIGMOID, RELU, TANH, NONE = 0, 1, 2, 3
ACTIVATION_CODES = {"sigmoid": SIGMOID, "relu": RELU, "tanh": TANH, "none": NONE}
_MAX_WORKSPACES = 4  # a few batch sizes (the last, shorter batch of an epoch) stay warm


@njit(cache=True, nogil=True)  # towers on CPU threads overlap
def bias_activation(z, b, act):
    """z = f(z + b) in place, row by row; `act` is an activation code."""
    n, m = z.shape
    one, zero = z.dtype.type(1), z.dtype.type(0)
    for i in range(n):
        row = z[i]
        if act == SIGMOID:
            for j in range(m):
                row[j] = one / (one + np.exp(-(row[j] + b[j])))
        elif act == RELU:
            for j in range(m):
                row[j] = max(row[j] + b[j], zero)
        elif act == TANH:
            for j in range(m):
                row[j] = np.tanh(row[j] + b[j])
        else:
            for j in range(m):
                row[j] = row[j] + b[j]


@njit(cache=True, nogil=True)  # towers on CPU threads overlap
def bias_sigmoid_f32(z, b):
    """z = sigmoid(z + b) in place for float32, twice as fast as bias_activation: numba calls
    libm's scalar expf per element, so here exp is Cephes' expf polynomial (about 1 ulp),
    which LLVM vectorizes. No fastmath, so a NaN still comes out as NaN."""
    n, m = z.shape
    scale_bits = np.empty(m, np.int32)
    scale = scale_bits.view(np.float32)  # 2**k, built from its exponent bits
    for i in range(n):
        row = z[i]
        for j in range(m):
            x = min(max(-(row[j] + b[j]), np.float32(-87.0)), np.float32(88.0))
            k = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
            r = x - k * np.float32(0.693359375) + k * np.float32(2.12194440e-4)  # x - k*ln2
            p = np.float32(1.9875691500e-4)
            p = p * r + np.float32(1.3981999507e-3)
            p = p * r + np.float32(8.3334519073e-3)
            p = p * r + np.float32(4.1665795894e-2)
            p = p * r + np.float32(1.6666665459e-1)
            p = p * r + np.float32(5.0000001201e-1)
            row[j] = p * r * r + r + np.float32(1.0)  # exp(r)
            scale_bits[j] = (np.int32(k) + np.int32(127)) << np.int32(23)
        for j in range(m):
            row[j] = np.float32(1.0) / (np.float32(1.0) + row[j] * scale[j])


@njit(cache=True, nogil=True)  # towers on CPU threads overlap
def activation_grad(d, a, act, db):
    """d *= f'(z) (from the output a = f(z)) in place, and db = column sums of the result."""
    n, m = d.shape
    one = d.dtype.type(1)
    db[:] = 0
    for i in range(n):
        row, out = d[i], a[i]
        if act == SIGMOID:
            for j in range(m):
                row[j] *= out[j] * (one - out[j])
        elif act == RELU:
            for j in range(m):
                if out[j] <= 0:
                    row[j] = 0
        elif act == TANH:
            for j in range(m):
                row[j] *= one - out[j] * out[j]
        for j in range(m):
            db[j] += row[j]


@njit(cache=True, nogil=True)  # towers on CPU threads overlap
def softmax_xent_grad(logits, labels, db):
    """Mean cross-entropy of `labels`; logits become (softmax - onehot) / batch in place and
    db their column sums. Returns -1 - i if labels[i] is not a class id."""
    n, m = logits.shape
    scale = logits.dtype.type(1.0 / n)
    db[:] = 0
    total = 0.0
    for i in range(n):
        row = logits[i]
        label = labels[i]
        if label < 0 or label >= m:
            return -1.0 - i
        top = row[0]
        for j in range(1, m):
            top = max(top, row[j])
        total += top - row[label]  # loss_i = log(sum(exp(z - top))) - (z_label - top)
        total_exp = row.dtype.type(0)
        for j in range(m):
            row[j] = np.exp(row[j] - top)
            total_exp += row[j]
        total += math.log(total_exp)
        inv = scale / total_exp
        for j in range(m):
            row[j] *= inv
        row[label] -= scale
        for j in range(m):
            db[j] += row[j]
    return total / n


@njit(cache=True, nogil=True)  # towers on CPU threads overlap
def softmax_rows(logits):
    """Row-wise softmax in place."""
    n, m = logits.shape
    for i in range(n):
        row = logits[i]
        top = row.max()
        total = row.dtype.type(0)
        for j in range(m):
            row[j] = np.exp(row[j] - top)
            total += row[j]
        inv = 1 / total
        for j in range(m):
            row[j] *= inv


class Kernels:
    """The numba backend (interface: see numpy_kernels)."""

    name = "numba"
    xp = np

    def __init__(self):
        self._workspaces = OrderedDict()

    def to_device(self, array, dtype):
        return np.ascontiguousarray(array, dtype=dtype)

    def to_host(self, array):
        return np.asarray(array)

    def _workspace(self, weights, x):
        """Per-layer output buffers for this batch size, dtype and layer widths."""
        key = (x.shape[0], x.dtype.str) + tuple(w.shape[1] for w in weights)
        ws = self._workspaces.get(key)
        if ws is None:
            ws = [np.empty((x.shape[0], w.shape[1]), x.dtype) for w in weights]
            ws += [np.empty((x.shape[0], w.shape[0]), x.dtype) for w in weights[1:]]
            self._workspaces[key] = ws
            if len(self._workspaces) > _MAX_WORKSPACES:
                self._workspaces.popitem(last=False)
        else:
            self._workspaces.move_to_end(key)
        return ws

    def _forward(self, weights, biases, x, act, ws):
        """Fill ws[:L] with every layer's output; the last one holds the raw logits."""
        inputs = x
        for i, (w, b) in enumerate(zip(weights, biases)):
            np.dot(inputs, w, out=ws[i])
            if i < len(weights) - 1 and act == SIGMOID and x.dtype == np.float32:
                bias_sigmoid_f32(ws[i], b)
            elif i < len(weights) - 1:
                bias_activation(ws[i], b, act)
            inputs = ws[i]
        logits = ws[len(weights) - 1]
        bias_activation(logits, biases[-1], NONE)
        return logits

    def predict(self, weights, biases, x, activation):
        logits = self._forward(weights, biases, x, ACTIVATION_CODES[activation], self._workspace(weights, x))
        probs = logits.copy()
        softmax_rows(probs)
        return probs

    def loss_and_gradients(self, weights, biases, x, y, activation, out=None):
        act, n_layers = ACTIVATION_CODES[activation], len(weights)
        if out is None:
            out = ([np.empty_like(w) for w in weights], [np.empty_like(b) for b in biases])
        grads_w, grads_b = out
        ws = self._workspace(weights, x)
        d = self._forward(weights, biases, x, act, ws)
        loss = softmax_xent_grad(d, y, grads_b[-1])
        if loss < 0:
            check_labels(y, d.shape[1])  # raises: the kernel found a label that is not a class id
        for i in range(n_layers - 1, -1, -1):
            below = x if i == 0 else ws[i - 1]
            np.dot(below.T, d, out=grads_w[i])
            if i > 0:
                upstream = ws[n_layers + i - 1]
                np.dot(d, weights[i].T, out=upstream)
                activation_grad(upstream, below, act, grads_b[i - 1])
                d = upstream
        return float(loss), grads_w, grads_b




@njit(cache=True, nogil=True, parallel=True)
def col2im(grad_windows, out, stride):
    """Add grad_windows [n, oh, ow, kh, kw, c] onto out [n, h, w, c] (the padded input) in place:
    conv2d's input gradient. One image per thread; the channel loop reads whole rows."""
    n, oh, ow, kh, kw, c = grad_windows.shape
    for b in prange(n):
        for y in range(oh):
            for x in range(ow):
                for i in range(kh):
                    row = out[b, y * stride + i]
                    for j in range(kw):
                        target = row[x * stride + j]
                        source = grad_windows[b, y, x, i, j]
                        for k in range(c):
                            target[k] += source[k]
