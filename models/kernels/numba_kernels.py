"""The numba backend of the engine's ops (interface: numpy_kernels): BLAS for the matmuls,
numba to fuse the elementwise work.

Numba loops reach a fraction of BLAS's speed on matmuls, so every matmul stays numpy's `@`
(np.dot's results, bit for bit, without its Python-level dispatch); numba does, in one pass each:
- bias add + activation, in place on the matmul's output;
- softmax + cross-entropy + its gradient;
- upstream gradient * activation derivative + that layer's bias gradient (column sums).

The kernels are serial: with 2 threads, `parallel=True` saved 3.5 us of a ~380 us step
(batch 100) on the sigmoid and nothing elsewhere, below run-to-run noise, and the launcher
gives each computing process one thread anyway. Kernels keep no state: one object serves
every thread.
"""

import functools
import math

import numpy as np

from zmqflow.common.jit import load_numba
from zmqflow.models.kernels import numpy_kernels
from zmqflow.models.kernels.numpy_kernels import check_labels

_numba = load_numba()   # without scipy (common/jit.py)
njit, prange = _numba.njit, _numba.prange

kernel = functools.partial(njit, cache=True, nogil=True, error_model="numpy")
"""How every kernel here compiles. nogil: towers on CPU threads overlap. error_model "numpy": a float
division by zero gives inf as in numpy rather than raising, so LLVM may vectorize loops that divide
(the sigmoid's: 12.4 -> 5.6 us for 100x100, bit for bit the same; no kernel here divides by zero)."""

SIGMOID, RELU, TANH, NONE = 0, 1, 2, 3
FLOAT32 = np.dtype(np.float32)
ACTIVATION_CODES = {"sigmoid": SIGMOID, "relu": RELU, "tanh": TANH, "none": NONE}


@kernel
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


@kernel
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


@kernel
def activation_grad(g, a, act, d, db):
    """d = g * f'(z) (from the output a = f(z)) and db = column sums of d, for a sigmoid, relu or tanh
    (a linear layer's d is g: column_sums)."""
    n, m = g.shape
    one = g.dtype.type(1)
    db[:] = 0
    for i in range(n):
        row, out, res = g[i], a[i], d[i]
        if act == SIGMOID:
            for j in range(m):
                res[j] = row[j] * out[j] * (one - out[j])
        elif act == RELU:
            for j in range(m):
                res[j] = row[j] if out[j] > 0 else 0
        elif act == TANH:
            for j in range(m):
                res[j] = row[j] * (one - out[j] * out[j])
        for j in range(m):
            db[j] += res[j]


@kernel
def softmax_xent_grad(logits, labels):
    """(mean cross-entropy of `labels`, how many rows' first largest logit is the label's); logits
    become (softmax - onehot) / batch in place. The loss is -1 - i if labels[i] is not a class id."""
    n, m = logits.shape
    scale = logits.dtype.type(1.0 / n)
    total = 0.0
    correct = 0
    for i in range(n):
        row = logits[i]
        label = labels[i]
        if label < 0 or label >= m:
            return -1.0 - i, 0
        top, best = row[0], 0
        for j in range(1, m):
            if row[j] > top:
                top, best = row[j], j
        correct += best == label
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
    return total / n, correct


@kernel
def column_sums(g, db):
    """db = the column sums of g, row after row (the order activation_grad adds in): a linear
    layer's bias gradient."""
    n, m = g.shape
    db[:] = 0
    for i in range(n):
        for j in range(m):
            db[j] += g[i, j]


@kernel
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


class Kernels(numpy_kernels.Kernels):
    """The numba backend: host memory as numpy's, its own ops."""

    name = "numba"

    def dense(self, x, w, b, activation):
        z = x @ w
        act = ACTIVATION_CODES[activation]
        if b is None and act == NONE:
            return z
        if b is None:
            b = np.zeros(z.shape[1], z.dtype)
        if act == SIGMOID and z.dtype == FLOAT32:
            bias_sigmoid_f32(z, b)
        else:
            bias_activation(z, b, act)
        return z

    def dense_grad(self, g, x, w, y, activation, need_dx, need_db):
        g = np.ascontiguousarray(g)   # np.empty, not np.empty_like: that one dispatches in Python
        d, db = g if activation == "none" else np.empty(g.shape, g.dtype), np.empty(g.shape[1], g.dtype)
        if activation != "none":
            activation_grad(g, y, ACTIVATION_CODES[activation], d, db)
        elif need_db:
            column_sums(g, db)
        return d @ w.T if need_dx else None, x.T @ d, db if need_db else None

    def softmax_cross_entropy(self, logits, labels):
        d = logits.copy()
        loss, correct = softmax_xent_grad(d, labels)
        if loss < 0:
            check_labels(labels, d.shape[1])  # raises: the kernel found a label that is not a class id
        return loss, d, correct

    def softmax(self, logits):
        probs = logits.copy()
        softmax_rows(probs)
        return probs


@kernel(parallel=True)
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
