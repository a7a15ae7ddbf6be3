"""Keras-style layers whose gradients the library computes (zmqflow.models.ops does the calculus).

A layer is built once for a per-example input shape (no batch axis): `build`
declares its weights and returns its output shape. `forward(params, x, ctx)`
computes with `params[weight_name]` tensors; `ctx` says whether it trains and
collects the new values of non-trainable weights (BatchNorm's moving
statistics). Names are given by the container (`dense`, `dense_1`, ... as in
Keras) unless the user sets one, so weights are `dense/kernel`, `conv2d/bias`...
"""

import dataclasses
import math

import numpy as np

from zmqflow.models import conv_ops, ops, spec
from zmqflow.models.autograd import constant


@dataclasses.dataclass(frozen=True)
class Weight:
    """A weight a layer declares: its name within the layer, shape, initializer and trainability."""

    name: str
    shape: tuple
    initializer: str = "glorot_uniform"
    trainable: bool = True


class Context:
    """What a forward pass knows besides its inputs: training or not, a seeded RNG for dropout,
    `updates` ({variable name: new value}) for non-trainable weights, `rows` ({table name:
    sorted row ids}) for tables given as only the rows the batch reads (sparse embeddings), and
    the backend (zmqflow.models.kernels) each layer computes on: `placed` {layer name: Kernels},
    the others on `kernels`, which is also where the inputs are given and the output is wanted."""

    __slots__ = ("training", "seed", "updates", "rows", "host", "placed", "_rng")   # one per step

    def __init__(self, training=False, seed=0, rows=None, kernels=ops.REFERENCE, placed=None):
        self.training, self.seed = training, seed
        self.updates = {}
        self.rows = rows or {}
        self.host, self.placed = kernels, placed or {}
        self._rng = None

    @property
    def rng(self):
        """Made when a layer first draws (dropout): seeding costs more than a small step's arithmetic."""
        if self._rng is None:
            self._rng = np.random.default_rng(self.seed)
        return self._rng

    def kernels(self, layer):
        """The backend `layer` computes on."""
        return self.placed.get(layer.name, self.host)


class Node:
    """A symbolic tensor of a functional network: which layer made it from which nodes, and its
    per-example shape. `Input(...)` makes the first ones; calling a layer on nodes makes more."""

    __slots__ = ("layer", "inputs", "shape", "name", "dtype")

    def __init__(self, layer, inputs, shape=None, name=None, dtype="float32"):
        self.layer, self.inputs, self.shape, self.name, self.dtype = layer, inputs, shape, name, dtype

    def __repr__(self):
        return f"Node({self.name or (self.layer and self.layer.kind)}, shape={self.shape})"


def Input(shape, dtype="float32", name=None):
    """An input of a functional network: per-example `shape`, e.g. (784,) or (28, 28, 1)."""
    return Node(None, [], tuple(int(n) for n in shape), name, str(np.dtype(dtype)))


class Layer:
    """Base class: subclasses set `kind`, implement `build` (declare weights) and `forward`.
    Calling a layer on a Node (or a list of them) adds it to a functional network."""

    kind = "layer"

    def __init__(self, name=None, device=None):
        self.name, self.device = name, device
        self.weights = []
        self.input_shape = self.output_shape = None

    def __call__(self, inputs):
        nodes = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if not all(isinstance(n, Node) for n in nodes):
            raise TypeError(f"{type(self).__name__} is called on Input(...) nodes or other layers' outputs")
        return Node(self, nodes)

    def build(self, input_shape):
        self.input_shape = self.output_shape = tuple(input_shape)
        return self.output_shape

    def weight(self, name, shape, initializer="glorot_uniform", trainable=True):
        self.weights.append(Weight(name, tuple(int(n) for n in shape), initializer, trainable))

    def param(self, params, name):
        return params[f"{self.name}/{name}"]

    def forward(self, params, x, ctx):
        raise NotImplementedError

    def describe(self):
        return f"{self.name} ({self.kind}) -> {list(self.output_shape)}"


def _positive(value, what):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return value


def _windowed(layer, input_shape, window, channels):
    """Set and return the output shape [oh, ow, channels] of a `window`-sized sliding layer (conv, pooling)."""
    layer.input_shape = tuple(input_shape)
    oh, ow = (conv_ops.output_size(n, window, layer.strides, layer.padding)[0] for n in input_shape[:2])
    layer.output_shape = (oh, ow, channels)
    return layer.output_shape


def _padding(padding):
    if padding not in conv_ops.PADDINGS:
        raise ValueError(f"padding must be 'same' or 'valid', got {padding!r}")
    return padding


class Dense(Layer):
    """activation(x @ kernel + bias), one fused op on the layer's backend. `weight_names` name the
    kernel and bias variables (Keras' kernel and bias; the built-in MLP keeps TF's weights and biases)."""

    kind = "dense"

    def __init__(self, units, activation=None, use_bias=True, kernel_initializer="glorot_uniform", name=None,
                 device=None, weight_names=("kernel", "bias")):
        super().__init__(name, device)
        self.units, self.use_bias = _positive(units, "Dense units"), use_bias
        self.activation_name, self.activation = activation, ops.activation(activation)
        self.kernel_initializer, self.weight_names = kernel_initializer, tuple(weight_names)
        self._fused = activation if activation in ops.FUSED else "none"   # the backend applies it itself
        self._after = None if self._fused != "none" or self.activation is ops.identity else self.activation

    def build(self, input_shape):
        self.input_shape = tuple(input_shape)
        kernel, bias = self.weight_names
        self.weight(kernel, (input_shape[-1], self.units), self.kernel_initializer)
        if self.use_bias:
            self.weight(bias, (self.units,), "zeros")
        self._keys = f"{self.name}/{kernel}", f"{self.name}/{bias}"
        self.output_shape = self.input_shape[:-1] + (self.units,)
        return self.output_shape

    def forward(self, params, x, ctx):
        kernel, bias = self._keys
        y = ops.dense(x, params[kernel], params[bias] if self.use_bias else None, self._fused, ctx.kernels(self))
        return y if self._after is None else self._after(y)


class Conv2D(Layer):
    """2-D convolution over [height, width, channels] inputs; kernel [kh, kw, in, filters] as in TF."""

    kind = "conv2d"

    def __init__(self, filters, kernel_size, strides=1, padding="valid", activation=None, use_bias=True, name=None,
                 device=None):
        super().__init__(name, device)
        self.filters = _positive(filters, "Conv2D filters")
        self.kernel_size = _positive(kernel_size, "Conv2D kernel_size")
        self.strides, self.padding = _positive(strides, "Conv2D strides"), _padding(padding)
        self.activation, self.use_bias = ops.activation(activation), use_bias

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"Conv2D expects [height, width, channels] inputs, got {list(input_shape)} "
                             "(add a Reshape first)")
        k = self.kernel_size
        self.weight("kernel", (k, k, input_shape[-1], self.filters))
        if self.use_bias:
            self.weight("bias", (self.filters,), "zeros")
        return _windowed(self, input_shape, k, self.filters)

    def forward(self, params, x, ctx):
        y = conv_ops.conv2d(x, self.param(params, "kernel"), self.strides, self.padding)
        if self.use_bias:
            y = ops.add(y, self.param(params, "bias"))
        return self.activation(y)


class _Pool(Layer):
    op = None

    def __init__(self, pool_size=2, strides=None, padding="valid", name=None, device=None):
        super().__init__(name, device)
        self.pool_size = _positive(pool_size, f"{type(self).__name__} pool_size")
        self.strides = _positive(strides, f"{type(self).__name__} strides") if strides is not None else self.pool_size
        self.padding = _padding(padding)

    def build(self, input_shape):
        if len(input_shape) != 3:
            raise ValueError(f"{type(self).__name__} expects [height, width, channels], got {list(input_shape)}")
        return _windowed(self, input_shape, self.pool_size, input_shape[-1])

    def forward(self, params, x, ctx):
        return type(self).op(x, self.pool_size, self.strides, self.padding)


class MaxPool2D(_Pool):
    kind = "max_pooling2d"
    op = staticmethod(conv_ops.max_pool2d)


class AvgPool2D(_Pool):
    kind = "average_pooling2d"
    op = staticmethod(conv_ops.avg_pool2d)


class Flatten(Layer):
    kind = "flatten"

    def build(self, input_shape):
        self.input_shape = tuple(input_shape)
        self.output_shape = (int(np.prod(input_shape)),)
        return self.output_shape

    def forward(self, params, x, ctx):
        return ops.reshape(x, (x.shape[0],) + self.output_shape)


class Reshape(Layer):
    kind = "reshape"

    def __init__(self, target_shape, name=None, device=None):
        super().__init__(name, device)
        self.target_shape = tuple(int(n) for n in target_shape)

    def build(self, input_shape):
        if int(np.prod(input_shape)) != int(np.prod(self.target_shape)):
            raise ValueError(f"Reshape cannot turn {list(input_shape)} ({int(np.prod(input_shape))} values) into "
                             f"{list(self.target_shape)} ({int(np.prod(self.target_shape))} values)")
        self.input_shape, self.output_shape = tuple(input_shape), self.target_shape
        return self.output_shape

    def forward(self, params, x, ctx):
        return ops.reshape(x, (x.shape[0],) + self.target_shape)


class Embedding(Layer):
    """Integer ids [..] -> vectors [.., output_dim]; the table is `embedding/embeddings` as in Keras.

    `sparse` (default): when the layer reads a network input directly, a worker pulls only the
    rows a batch touches and pushes their gradients as rows (IndexedSlices); the table may be
    far larger than any worker's share of it. `sparse=False` pulls and pushes the whole table."""

    kind = "embedding"

    def __init__(self, input_dim, output_dim, sparse=True, name=None, device=None):
        super().__init__(name, device)
        self.input_dim, self.output_dim = _positive(input_dim, "Embedding input_dim"), _positive(
            output_dim, "Embedding output_dim")
        self.sparse = bool(sparse)

    def build(self, input_shape):
        self.input_shape = tuple(input_shape)
        self.weight("embeddings", (self.input_dim, self.output_dim), "uniform:0.05")
        self.output_shape = self.input_shape + (self.output_dim,)
        return self.output_shape

    def forward(self, params, x, ctx):
        ids = np.asarray(x.value).astype(np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.input_dim):
            raise ValueError(f"{self.name}: ids must be in [0, {self.input_dim}), got {int(ids.min())}..{int(ids.max())}")
        rows = ctx.rows.get(f"{self.name}/embeddings")
        if rows is not None:   # the table holds only rows `rows`: look ids up among them
            local = np.minimum(np.searchsorted(rows, ids), len(rows) - 1)
            if ids.size and not np.array_equal(rows[local], ids):
                raise ValueError(f"{self.name}: the batch reads rows of the table that were not pulled")
            ids = local
        return ops.gather_rows(self.param(params, "embeddings"), ids)


class Dropout(Layer):
    kind = "dropout"

    def __init__(self, rate, name=None, device=None):
        super().__init__(name, device)
        if not 0 <= rate < 1:
            raise ValueError(f"Dropout rate must be in [0, 1), got {rate!r}")
        self.rate = float(rate)

    def forward(self, params, x, ctx):
        return ops.dropout(x, self.rate, ctx.rng) if ctx.training and self.rate else x


class Activation(Layer):
    kind = "activation"

    def __init__(self, activation, name=None, device=None):
        super().__init__(name, device)
        self.activation = ops.activation(activation)

    def forward(self, params, x, ctx):
        return self.activation(x)


class LayerNorm(Layer):
    """Normalizes each example over its last axis, then scales (gamma) and shifts (beta)."""

    kind = "layer_normalization"

    def __init__(self, epsilon=1e-3, name=None, device=None):
        super().__init__(name, device)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        super().build(input_shape)
        self.weight("gamma", (input_shape[-1],), "ones")
        self.weight("beta", (input_shape[-1],), "zeros")
        return self.output_shape

    def forward(self, params, x, ctx):
        xhat, _, _ = ops.normalize(x, (-1,), self.epsilon)
        return ops.add(ops.mul(xhat, self.param(params, "gamma")), self.param(params, "beta"))


class BatchNorm(Layer):
    """Batch normalization over every axis but the last, as Keras' BatchNormalization.

    Training normalizes with the batch's statistics and records the new moving mean and
    variance (`ctx.updates`); inference uses the moving ones. The moving statistics are
    non-trainable variables, stored on the ps like TensorFlow's.
    """

    kind = "batch_normalization"

    def __init__(self, momentum=0.99, epsilon=1e-3, name=None, device=None):
        super().__init__(name, device)
        self.momentum, self.epsilon = float(momentum), float(epsilon)

    def build(self, input_shape):
        super().build(input_shape)
        n = input_shape[-1]
        self.weight("gamma", (n,), "ones")
        self.weight("beta", (n,), "zeros")
        self.weight("moving_mean", (n,), "zeros", trainable=False)
        self.weight("moving_variance", (n,), "ones", trainable=False)
        return self.output_shape

    def forward(self, params, x, ctx):
        axes = tuple(range(len(x.shape) - 1))
        if ctx.training:
            xhat, mu, var = ops.normalize(x, axes, self.epsilon)
            m = self.momentum
            for stat, batch in (("moving_mean", mu), ("moving_variance", var)):
                old = self.param(params, stat).value
                ctx.updates[f"{self.name}/{stat}"] = (m * old + (1 - m) * batch.reshape(old.shape)).astype(old.dtype)
        else:
            mean, var = self.param(params, "moving_mean").value, self.param(params, "moving_variance").value
            xhat = ops.mul(ops.add(x, constant(-mean)), constant(1.0 / np.sqrt(var + self.epsilon)))
        return ops.add(ops.mul(xhat, self.param(params, "gamma")), self.param(params, "beta"))


class Concatenate(Layer):
    """Joins several inputs along the last axis (functional networks only)."""

    kind = "concatenate"

    def build(self, input_shapes):
        shapes = [tuple(s) for s in input_shapes]
        if len({s[:-1] for s in shapes}) != 1:
            raise ValueError(f"Concatenate needs inputs that differ only in the last axis, got {shapes}")
        self.input_shape = shapes
        self.output_shape = shapes[0][:-1] + (sum(s[-1] for s in shapes),)
        return self.output_shape

    def forward(self, params, xs, ctx):
        return ops.concat(list(xs), axis=-1)


class Add(Layer):
    """Sums several inputs of one shape (functional networks only): Keras' `layers.Add`, the join of
    parallel branches."""

    kind = "add"

    def build(self, input_shapes):
        shapes = [tuple(s) for s in input_shapes] if input_shapes and isinstance(input_shapes[0], (list, tuple)) \
            else [tuple(input_shapes)]
        if len(shapes) < 2 or len(set(shapes)) != 1:
            raise ValueError(f"Add needs two or more inputs of one shape, got {shapes}")
        self.input_shape, self.output_shape = shapes, shapes[0]
        return self.output_shape

    def forward(self, params, xs, ctx):
        total = xs[0]
        for x in xs[1:]:
            total = ops.add(total, x)
        return total


# ------------------------------------------------ initializers


def initial_value(initializer, shape, rng):
    """One weight's first value (float64), drawn as Keras' initializer of that name."""
    kind, _, arg = initializer.partition(":")
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "ones":
        return np.ones(shape)
    if kind == "uniform":
        limit = float(arg or 0.05)
        return rng.uniform(-limit, limit, size=shape)
    if kind == "glorot_uniform":
        receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
        fan_in, fan_out = shape[-2] * receptive if len(shape) > 1 else shape[0], shape[-1] * receptive
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, size=shape)
    if kind == "truncated_normal":   # values beyond two standard deviations are drawn again, as in TF
        values = rng.standard_normal(size=shape)
        bad = np.abs(values) > 2.0
        while bad.any():
            values[bad] = rng.standard_normal(size=int(bad.sum()))
            bad = np.abs(values) > 2.0
        return values * float(arg or 0.05)
    raise ValueError(f"unknown initializer {initializer!r}")


weight_rng = spec.variable_rng
