"""The built-in MLP model: the `Model` protocol of zmqflow.models.spec on a kernel backend.

It checks what comes in (parameter names and shapes, batch shapes, labels), moves
arrays to the backend and back, and leaves the arithmetic to the kernels.
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.protocol import checked_param
from zmqflow.models.spec import mlp_initial_values, mlp_variables, validate_spec
from zmqflow.models.kernels import get_backend


class MLP:
    """Dense layers with a shared activation and a softmax cross-entropy head.

    `backend` is a name ('numpy', 'numba', 'cupy') or a Kernels object. Not thread-safe
    (the numba and cupy kernels reuse scratch buffers): use one MLP per thread.
    """

    def __init__(self, spec, backend="numpy"):
        self.spec = validate_spec(spec)
        if self.spec["type"] != "mlp":
            raise InvalidArgumentError(f"MLP needs a spec of type 'mlp', got {self.spec['type']!r}")
        self.kernels = get_backend(backend) if isinstance(backend, str) else backend
        self.activation = self.spec["activation"]
        self.dtype = np.dtype(self.spec["dtype"])
        self._variables = mlp_variables(self.spec)
        self._on_host = self.kernels.xp is np

    def variables(self):
        return list(self._variables)

    def initial_values(self, seed=None):
        """Initial values from `seed` (the spec's seed when None); the same on every task."""
        return mlp_initial_values(self.spec, seed)

    def loss_and_gradients(self, params, x, y, out=None):
        """(mean loss, {name: gradient}). With `out` ({name: array} of the right shapes and
        dtype) the gradients are written there, which spares an allocation per step."""
        weights, biases = self._device_params(params)
        x, y = self._batch(x), self._labels(y, x)
        dev_out = None
        if out is not None and self._on_host:
            dev_out = ([out[v.name] for v in self._variables[0::2]], [out[v.name] for v in self._variables[1::2]])
        loss, grads_w, grads_b = self.kernels.loss_and_gradients(weights, biases, x, y, self.activation, dev_out)
        grads = {}
        for var_w, var_b, g_w, g_b in zip(self._variables[0::2], self._variables[1::2], grads_w, grads_b):
            grads[var_w.name] = self._host(g_w, None if out is None else out[var_w.name])
            grads[var_b.name] = self._host(g_b, None if out is None else out[var_b.name])
        return loss, grads

    def predict(self, params, x):
        """Class probabilities [batch, classes] as a numpy array."""
        weights, biases = self._device_params(params)
        return self.kernels.to_host(self.kernels.predict(weights, biases, self._batch(x), self.activation))

    def _device_params(self, params):
        """[weights...], [biases...] on the backend, after checking names and shapes."""
        arrays = [self.kernels.to_device(checked_param(params, var), self.dtype) for var in self._variables]
        return arrays[0::2], arrays[1::2]

    def _batch(self, x):
        n_in = self._variables[0].shape[0]
        if getattr(x, "ndim", None) != 2 or x.shape[1] != n_in or x.shape[0] == 0:
            raise InvalidArgumentError(f"inputs must have shape [batch >= 1, {n_in}], got {list(np.shape(x))}")
        return self.kernels.to_device(x, self.dtype)

    def _labels(self, y, x):
        y = np.asarray(y) if self._on_host or not hasattr(y, "dtype") else y
        if y.shape != (x.shape[0],) or y.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"labels must be integers of shape [{x.shape[0]}], got {y.dtype} of shape {list(y.shape)}")
        return y

    def _host(self, grad, out):
        if self._on_host:
            if out is not None and grad is not out:
                np.copyto(out, grad)
                return out
            return grad
        return self.kernels.to_host(grad, out)
