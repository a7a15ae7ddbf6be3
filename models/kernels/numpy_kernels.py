"""Plain-numpy forward and backward pass of the MLP: the readable reference that the
numba and CuPy kernels are tested against. It allocates freely; speed is not its job.

Every backend module exposes a `Kernels` class with the same methods:

- `to_device(array, dtype)` / `to_host(array)`: move arrays to and from the backend;
- `predict(weights, biases, x, activation)`: class probabilities [batch, classes];
- `loss_and_gradients(weights, biases, x, y, activation, out=None)`:
  (mean softmax cross-entropy as a float, [dW per layer], [db per layer]); with
  `out=(dWs, dbs)` the gradients are written into those arrays and returned.

`weights[i]` is [n_in, n_out], `biases[i]` is [n_out]; the last layer gives logits and
the activation applies to every other layer. `y` holds integer class ids.
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError

ACTIVATIONS = {
    "sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z)),
    "relu": lambda z: np.maximum(z, 0),
    "tanh": np.tanh,
    "none": lambda z: z,
}

# Derivative of each activation written in terms of its output a = f(z).
DERIVATIVES = {
    "sigmoid": lambda a: a * (1 - a),
    "relu": lambda a: (a > 0).astype(a.dtype),
    "tanh": lambda a: 1 - a * a,
    "none": lambda a: np.ones_like(a),
}


def forward(weights, biases, x, activation):
    """The activations of every hidden layer and the logits."""
    act = ACTIVATIONS[activation]
    hidden = [x]
    for w, b in zip(weights[:-1], biases[:-1]):
        hidden.append(act(hidden[-1] @ w + b).astype(x.dtype))
    logits = hidden[-1] @ weights[-1] + biases[-1]
    return hidden, logits


def softmax(logits):
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)


def softmax_cross_entropy(logits, y):
    """Mean cross-entropy of integer labels `y` and its gradient with respect to the logits."""
    n = logits.shape[0]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(shifted).sum(axis=1))
    loss = float(np.mean(log_sum - shifted[np.arange(n), y]))
    dlogits = softmax(logits)
    dlogits[np.arange(n), y] -= 1
    return loss, dlogits / n


def backward(weights, hidden, dlogits, activation):
    """Gradients of every weight and bias, last layer first, by the chain rule."""
    deriv = DERIVATIVES[activation]
    d = dlogits
    grads_w, grads_b = [], []
    for i in range(len(weights) - 1, -1, -1):
        grads_w.append(hidden[i].T @ d)
        grads_b.append(d.sum(axis=0))
        if i > 0:
            d = (d @ weights[i].T) * deriv(hidden[i])
    return grads_w[::-1], grads_b[::-1]


def check_labels(y, classes):
    """TF's error for a label that is not a class id (numpy would wrap -1 silently)."""
    bad = (y < 0) | (y >= classes)
    if bad.any():
        raise InvalidArgumentError(
            f"Received a label value of {y[bad][0]} which is outside the valid range of [0, {classes}).")


class Kernels:
    """The numpy backend (see the module docstring for the shared interface)."""

    name = "numpy"
    xp = np

    def to_device(self, array, dtype):
        return np.ascontiguousarray(array, dtype=dtype)

    def to_host(self, array):
        return np.asarray(array)

    def predict(self, weights, biases, x, activation):
        return softmax(forward(weights, biases, x, activation)[1])

    def loss_and_gradients(self, weights, biases, x, y, activation, out=None):
        check_labels(y, weights[-1].shape[1])
        hidden, logits = forward(weights, biases, x, activation)
        loss, dlogits = softmax_cross_entropy(logits, y)
        grads_w, grads_b = backward(weights, hidden, dlogits, activation)
        if out is None:
            return loss, grads_w, grads_b
        for dst, src in zip(out[0] + out[1], grads_w + grads_b):
            np.copyto(dst, src)
        return loss, out[0], out[1]
