"""A JAX model on zmqflow's cluster: a pure `apply(params, x)` and its parameter pytree.

    def apply(params, x):
        h = jax.nn.relu(x @ params["hidden"]["w"] + params["hidden"]["b"])
        return h @ params["out"]["w"] + params["out"]["b"]

    model = JaxModel(apply, init, input_shape=(784,))      # init(key) -> params, or a params pytree

The pytree's leaves become named variables on the ps (`hidden/w`, `out/b`, ...), so
placement, checkpoints, sync/async training and serving treat them as any other
variable. The worker computes the loss and its gradient with `jax.value_and_grad`,
compiled once by `jax.jit`; serving runs the same jitted `apply`.
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.variables import VariableSpec
from zmqflow.models.protocol import checked_param

LOSSES = ("softmax_cross_entropy", "sigmoid_cross_entropy", "mse")


def _jax():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        raise InvalidArgumentError("the JAX adapter needs JAX: pip install 'zmqflow[jax]'") from None
    return jax, jnp


def _path_name(path):
    """A pytree key path as a variable name: (DictKey('hidden'), DictKey('w')) -> 'hidden/w'."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


class JaxModel:
    """`apply(params, x) -> outputs` (logits for the cross-entropy heads) as a zmqflow model.

    `init` is a params pytree or a function `init(key) -> params` (then `initial_values(seed)`
    draws with `jax.random.PRNGKey(seed)`). `loss` is a head name (LOSSES) or a function
    `loss(outputs, y) -> scalar`. `input_shape` is one example's shape.
    """

    framework, onnx_exporter = "JAX", "jax2onnx"   # zmqflow exports only its own layers

    def __init__(self, apply, init, input_shape, loss="softmax_cross_entropy", dtype="float32", seed=0):
        jax, jnp = _jax()
        self.apply, self.init, self.seed = apply, init, seed
        self.input_shape, self.dtype = tuple(int(n) for n in input_shape), np.dtype(dtype)
        if not callable(loss) and loss not in LOSSES:
            raise InvalidArgumentError(f"loss {loss!r} is not one of {', '.join(LOSSES)} or a function")
        self.loss_name = loss if isinstance(loss, str) else "custom"
        params = self._draw(seed)
        leaves, self.treedef = jax.tree_util.tree_flatten_with_path(params)
        self.names = [_path_name(path) for path, _ in leaves]
        if len(set(self.names)) != len(self.names):
            raise InvalidArgumentError(f"the parameter pytree's paths must give distinct names, got {self.names}")
        self._variables = [VariableSpec(name, tuple(np.shape(leaf)), self.dtype.name)
                           for name, (_, leaf) in zip(self.names, leaves)]
        head = _head(jnp, loss)

        def loss_of(param_list, x, y):
            outputs = apply(jax.tree_util.tree_unflatten(self.treedef, param_list), x)
            return head(outputs, y), outputs
        self._value_and_grad = jax.jit(jax.value_and_grad(loss_of, has_aux=True))
        self._predict = jax.jit(lambda param_list, x: _outputs(jax, self.loss_name)(
            apply(jax.tree_util.tree_unflatten(self.treedef, param_list), x)))

    # ------------------------------------------------ declarations

    def variables(self):
        return list(self._variables)

    def input_signature(self):
        return {"input": (self.input_shape, self.dtype.name)}

    def initial_values(self, seed=None):
        jax, _ = _jax()
        leaves = jax.tree_util.tree_leaves(self._draw(self.seed if seed is None else seed))
        return {name: np.asarray(leaf, dtype=self.dtype) for name, leaf in zip(self.names, leaves)}

    def _draw(self, seed):
        jax, _ = _jax()
        return self.init(jax.random.PRNGKey(seed)) if callable(self.init) else self.init

    # ------------------------------------------------ compute

    def step(self, params, batch):
        x, y = batch
        (loss, outputs), grads = self._value_and_grad(self._list(params), np.asarray(x, self.dtype), np.asarray(y))
        metrics = {"loss": float(loss)}
        if self.loss_name == "softmax_cross_entropy":
            metrics["accuracy"] = float(np.mean(np.argmax(np.asarray(outputs), axis=-1) == np.asarray(y)))
        return float(loss), {n: np.asarray(g, self.dtype) for n, g in zip(self.names, grads)}, metrics

    def predict(self, params, x):
        return np.asarray(self._predict(self._list(params), np.asarray(x, self.dtype)))

    def _list(self, params):
        return [checked_param(params, var) for var in self._variables]


def _head(jnp, loss):
    if callable(loss):
        return loss
    if loss == "softmax_cross_entropy":
        def head(logits, y):
            log_p = logits - jnp.max(logits, axis=-1, keepdims=True)
            log_p = log_p - jnp.log(jnp.sum(jnp.exp(log_p), axis=-1, keepdims=True))
            return -jnp.mean(jnp.take_along_axis(log_p, y.astype(jnp.int32).reshape(-1, 1), axis=-1))
        return head
    if loss == "sigmoid_cross_entropy":
        return lambda x, t: jnp.mean(jnp.maximum(x, 0) - x * t.reshape(x.shape) + jnp.log1p(jnp.exp(-jnp.abs(x))))
    return lambda p, t: jnp.mean((p - t.reshape(p.shape)) ** 2)


def _outputs(jax, loss_name):
    if loss_name == "softmax_cross_entropy":
        return jax.nn.softmax
    if loss_name == "sigmoid_cross_entropy":
        return jax.nn.sigmoid
    return lambda z: z
