"""Differentiable ops: each forward computation with its backward beside it.

Every op takes and returns `Tensor`s (zmqflow.models.autograd) and works on
numpy or CuPy arrays alike (`xp_of` picks the array module of the values), so
the same layer code runs on the CPU and the GPU. The ops that pay to be fused
(dense, softmax cross-entropy) call a backend of zmqflow.models.kernels (numpy,
numba, CuPy), which the model picks per layer. Convolution and pooling live in
conv_ops.py.
"""

import math

import numpy as np

from zmqflow.models.autograd import Tensor, constant, unbroadcast
from zmqflow.models.kernels import numpy_kernels

REFERENCE = numpy_kernels.Kernels()
"""The backend of ops called without one: the numpy reference."""


def xp_of(value):
    """numpy, or cupy for a CuPy array."""
    if type(value).__module__.split(".")[0] == "cupy":
        import cupy
        return cupy
    return np


# ------------------------------------------------ arithmetic


def add(a, b):
    a, b = constant(a), constant(b)
    out = Tensor(a.value + b.value, (a, b))

    def backward(g):
        a.accumulate(unbroadcast(g, a.shape))
        b.accumulate(unbroadcast(g, b.shape))
    out.backward_fn = backward
    return out


def mul(a, b):
    a, b = constant(a), constant(b)
    out = Tensor(a.value * b.value, (a, b))

    def backward(g):
        a.accumulate(unbroadcast(g * b.value, a.shape))
        b.accumulate(unbroadcast(g * a.value, b.shape))
    out.backward_fn = backward
    return out


def dense(x, kernel, bias, activation, kernels=REFERENCE):
    """activation(x @ kernel + bias) for x [..., n], on a backend of zmqflow.models.kernels: one
    fused op, so the numba and CuPy backends add the bias and apply the activation in one pass.
    `bias` may be None; `activation` is one of the backends' ("sigmoid", "relu", "tanh", "none")."""
    x = x if isinstance(x, Tensor) else constant(x)
    value = x.value
    flat = value if value.ndim == 2 else value.reshape(-1, value.shape[-1])
    y = kernels.dense(flat, kernel.value, None if bias is None else bias.value, activation)

    def backward(g):
        dx, dw, db = kernels.dense_grad(g if flat is value else g.reshape(y.shape), flat, kernel.value, y,
                                        activation, x.requires_grad, bias is not None)
        if dx is not None:
            x.accumulate(dx if flat is value else dx.reshape(value.shape))
        kernel.accumulate(dw)
        if bias is not None:
            bias.accumulate(db)
    return Tensor(y if flat is value else y.reshape(value.shape[:-1] + y.shape[-1:]),
                  (x, kernel) if bias is None else (x, kernel, bias), backward)


def reshape(a, shape):
    """`shape` may hold one -1; the batch dimension is kept by the layers that call this."""
    out = Tensor(a.value.reshape(shape), (a,))
    out.backward_fn = lambda g: a.accumulate(g.reshape(a.shape))
    return out


def concat(tensors, axis=-1):
    tensors = [constant(t) for t in tensors]
    xp = xp_of(tensors[0].value)
    out = Tensor(xp.concatenate([t.value for t in tensors], axis=axis), tensors)
    sizes = np.cumsum([t.shape[axis] for t in tensors])[:-1]

    def backward(g):
        for t, part in zip(tensors, xp.split(g, [int(s) for s in sizes], axis=axis)):
            t.accumulate(part)
    out.backward_fn = backward
    return out


def mean(a):
    """The mean of every element, a scalar tensor."""
    out = Tensor(a.value.mean(), (a,))
    out.backward_fn = lambda g: a.accumulate(xp_of(a.value).full(a.shape, g / a.value.size, dtype=a.dtype))
    return out


# ------------------------------------------------ activations


def _elementwise(name):
    """Activation `name` of the reference backend's tables as an op (they are ufuncs: any device)."""
    function, derivative = numpy_kernels.ACTIVATIONS[name], numpy_kernels.DERIVATIVES[name]

    def op(a):
        y = function(a.value).astype(a.dtype, copy=False)
        out = Tensor(y, (a,))
        out.backward_fn = lambda g: a.accumulate(g * derivative(y))
        return out
    op.__name__ = name
    return op


relu, sigmoid, tanh = _elementwise("relu"), _elementwise("sigmoid"), _elementwise("tanh")
FUSED = ("relu", "sigmoid", "tanh")
"""The activations that a backend's `dense` applies itself."""


_GELU_C = math.sqrt(2.0 / math.pi)


def gelu(a):
    """GELU, tanh approximation (Keras' and JAX's `approximate=True`)."""
    xp, x = xp_of(a.value), a.value
    inner = _GELU_C * (x + 0.044715 * x ** 3)
    t = xp.tanh(inner)
    out = Tensor((0.5 * x * (1.0 + t)).astype(a.dtype, copy=False), (a,))

    def backward(g):
        d_inner = _GELU_C * (1.0 + 3 * 0.044715 * x * x)
        a.accumulate(g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner))
    out.backward_fn = backward
    return out


def softmax(a, axis=-1):
    xp = xp_of(a.value)
    e = xp.exp(a.value - a.value.max(axis=axis, keepdims=True))
    y = e / e.sum(axis=axis, keepdims=True)
    out = Tensor(y, (a,))
    out.backward_fn = lambda g: a.accumulate(y * (g - (g * y).sum(axis=axis, keepdims=True)))
    return out


def identity(a):
    return a


ACTIVATIONS = {"relu": relu, "sigmoid": sigmoid, "tanh": tanh, "gelu": gelu, "softmax": softmax,
               "linear": identity, None: identity}


def activation(name):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; expected one of "
                         f"{', '.join(str(k) for k in ACTIVATIONS if k)}")
    return ACTIVATIONS[name]


# ------------------------------------------------ layers' ops


def move(a, source, target):
    """`a` from the memory of backend `source` to that of `target` (through the host); its gradient
    goes back. Layers on different devices meet through this op."""
    if source.device == target.device:
        return a
    out = Tensor(target.to_device(source.to_host(a.value)), (a,))
    out.backward_fn = lambda g: a.accumulate(source.to_device(target.to_host(g)))
    return out


def gather_rows(table, ids):
    """table[ids] (an embedding lookup). The gradient of the table is dense here; the worker
    turns it into row ids + values for sparse variables."""
    ids = ids.value if isinstance(ids, Tensor) else ids
    out = Tensor(table.value[ids], (table,))

    def backward(g):
        xp = xp_of(table.value)
        grad = xp.zeros_like(table.value)
        flat = ids.reshape(-1)
        if xp is np:
            np.add.at(grad, flat, g.reshape(len(flat), -1))
        else:
            xp.add.at(grad, flat, g.reshape(len(flat), -1))
        table.accumulate(grad)
    out.backward_fn = backward
    return out


def dropout(a, rate, rng):
    """Inverted dropout: kept units scaled by 1/(1-rate), so inference needs no rescaling."""
    keep = (rng.random(a.shape) >= rate).astype(a.dtype) / (1.0 - rate)
    keep = xp_of(a.value).asarray(keep)
    out = Tensor(a.value * keep, (a,))
    out.backward_fn = lambda g: a.accumulate(g * keep)
    return out


def normalize(a, axes, epsilon):
    """(a - mean) / sqrt(var + eps) over `axes`, and the batch mean and variance it used."""
    xp = xp_of(a.value)
    mu = a.value.mean(axis=axes, keepdims=True)
    var = a.value.var(axis=axes, keepdims=True)
    inv = 1.0 / xp.sqrt(var + epsilon)
    xhat = (a.value - mu) * inv
    count = a.value.size // mu.size
    out = Tensor(xhat.astype(a.dtype, copy=False), (a,))

    def backward(g):
        # d xhat: the standard result for a mean and variance taken over the same elements
        a.accumulate(inv / count * (count * g - g.sum(axis=axes, keepdims=True)
                                    - xhat * (g * xhat).sum(axis=axes, keepdims=True)))
    out.backward_fn = backward
    return out, mu, var


# ------------------------------------------------ losses (scalar means over the batch)


def softmax_cross_entropy(logits, labels, kernels=REFERENCE, metrics=None):
    """Mean of -log softmax(logits)[label] over the batch; labels are integer class ids. The backend
    computes the loss, its gradient and the batch's accuracy in one pass; the accuracy goes to
    `metrics["accuracy"]` when a dict is given."""
    labels = labels.value if isinstance(labels, Tensor) else labels
    loss, d, correct = kernels.softmax_cross_entropy(logits.value, labels)
    if metrics is not None:
        metrics["accuracy"] = correct / len(labels)
    return Tensor(np.asarray(loss, logits.value.dtype), (logits,),
                  lambda g: logits.accumulate(d if float(g) == 1.0 else d * g))   # d * 1 is d


def sigmoid_cross_entropy(logits, targets):
    """Mean binary cross-entropy of independent labels (multi-label), from logits, stably:
    max(x, 0) - x*t + log(1 + exp(-|x|))."""
    xp, x = xp_of(logits.value), logits.value
    t = (targets.value if isinstance(targets, Tensor) else targets).astype(x.dtype).reshape(x.shape)
    loss = xp.maximum(x, 0) - x * t + xp.log1p(xp.exp(-xp.abs(x)))
    out = Tensor(loss.mean(), (logits,))

    def backward(g):
        p = 1.0 / (1.0 + xp.exp(-x))
        logits.accumulate((p - t) * (g / x.size))
    out.backward_fn = backward
    return out


def mean_squared_error(predictions, targets):
    p = predictions.value
    t = (targets.value if isinstance(targets, Tensor) else targets).astype(p.dtype).reshape(p.shape)
    diff = p - t
    out = Tensor((diff * diff).mean(), (predictions,))
    out.backward_fn = lambda g: predictions.accumulate(diff * (2.0 * g / p.size))
    return out


def huber(predictions, targets, delta=1.0):
    """Quadratic within `delta` of the target, linear beyond (Keras' Huber)."""
    xp, p = xp_of(predictions.value), predictions.value
    t = (targets.value if isinstance(targets, Tensor) else targets).astype(p.dtype).reshape(p.shape)
    diff = p - t
    small = xp.abs(diff) <= delta
    loss = xp.where(small, 0.5 * diff * diff, delta * (xp.abs(diff) - 0.5 * delta))
    out = Tensor(loss.mean(), (predictions,))
    out.backward_fn = lambda g: predictions.accumulate(xp.where(small, diff, delta * xp.sign(diff)) * (g / p.size))
    return out
