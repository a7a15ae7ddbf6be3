"""A network of zmqflow layers and a loss head, as a model of the protocol (zmqflow.models.protocol).

    net = Sequential([Reshape((28, 28, 1)), Conv2D(32, 5, padding="same", activation="relu"),
                      MaxPool2D(), Flatten(), Dense(10)], input_shape=(784,))
    model = LayerModel(net, loss="softmax_cross_entropy")

Heads: `softmax_cross_entropy` (integer class ids; predict gives probabilities),
`sigmoid_cross_entropy` (0/1 targets per output, multi-label; predict gives
probabilities), `mse` and `huber` (regression; predict gives the values).
"""

import dataclasses

import numpy as np

from zmqflow.common.device import DeviceSpec
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.variables import IndexedSlices, VariableSpec
from zmqflow.models import ops
from zmqflow.models.autograd import constant, variable
from zmqflow.models.layers import Context, initial_value, weight_rng
from zmqflow.models.protocol import checked_param

HEADS = {
    "softmax_cross_entropy": (ops.softmax_cross_entropy, lambda z: ops.softmax(z).value),
    "sigmoid_cross_entropy": (ops.sigmoid_cross_entropy, lambda z: ops.sigmoid(z).value),
    "mse": (ops.mean_squared_error, lambda z: z.value),
    "huber": (ops.huber, lambda z: z.value),
}


class LayerModel:
    def __init__(self, network, loss="softmax_cross_entropy", dtype="float32", seed=0):
        if loss not in HEADS:
            raise InvalidArgumentError(f"loss {loss!r} is not one of {', '.join(HEADS)}")
        self.network, self.loss_name, self.seed = network, loss, seed
        self.dtype = np.dtype(dtype)
        self._loss, self._outputs = HEADS[loss]
        for layer in network.layers:
            if layer.device is not None:
                try:
                    DeviceSpec.from_string(layer.device)
                except InvalidArgumentError as exc:
                    raise InvalidArgumentError(f"layer {layer.name}: {exc}") from None
        self._variables = [VariableSpec(f"{layer.name}/{w.name}", w.shape, self.dtype.name, w.trainable, w.initializer,
                                        layer.device)
                           for layer in network.layers for w in layer.weights]
        # sparse tables: {table variable: the input whose ids index it} (Embeddings reading an input)
        self._row_inputs = {f"{node.layer.name}/embeddings": node.inputs[0].name for node in network.nodes
                            if node.layer is not None and node.layer.kind == "embedding" and node.layer.sparse
                            and node.inputs[0].layer is None}
        self._layer_of = {f"{layer.name}/{w.name}": layer.name for layer in network.layers for w in layer.weights}
        self._gpu_layers = frozenset()
        self._steps = 0

    # ------------------------------------------------ declarations

    def variables(self):
        return list(self._variables)

    def input_signature(self):
        return {node.name: (node.shape, node.dtype) for node in self.network.inputs}

    def output_shape(self):
        return self.network.output_shape

    def initial_values(self, seed=None):
        seed = self.seed if seed is None else seed
        return {v.name: initial_value(v.initializer, v.shape, weight_rng(seed, v.name)).astype(self.dtype)
                for v in self._variables}

    # ------------------------------------------------ compute

    def sparse_rows(self, x):
        """{table: sorted unique row ids} of the sparse tables the batch `x` reads: a worker pulls
        only these rows and passes them to `step(..., rows=)`."""
        inputs = x if isinstance(x, dict) else {self.network.inputs[0].name: x}
        return {table: np.unique(np.asarray(inputs[name]).astype(np.int64)) for table, name in self._row_inputs.items()}

    def step(self, params, batch, rows=None):
        """(mean loss, {trainable name: gradient}, metrics); metrics["updates"] holds the new
        values of non-trainable variables when the network has any. With `rows` (from
        `sparse_rows`), each of those tables in `params` holds only its rows `rows[table]`, in
        that order, and its gradient comes back as IndexedSlices over them."""
        x, y = batch
        rows = rows or {}
        tensors = {v.name: (variable if v.trainable else constant)(self._on_device(
            v, self._param(params, v, rows.get(v.name))), v.name) for v in self._variables}
        self._steps += 1
        ctx = Context(training=True, seed=(self.seed, self._steps), rows=rows, gpu_layers=self._gpu_layers)
        logits = ops.to_device(self.network.forward(tensors, self._inputs(x), ctx), False)   # the head on the host
        loss = self._loss(logits, self._labels(y, logits))
        loss.backward()
        grads = {}
        for v in self._variables:
            if v.trainable:
                g = tensors[v.name].grad
                shape = tensors[v.name].value.shape
                grads[v.name] = (np.zeros(shape, self.dtype) if g is None else _host(g)).astype(self.dtype, copy=False)
                if v.name in rows:
                    grads[v.name] = IndexedSlices(rows[v.name], grads[v.name])
        metrics = {"loss": float(loss.value)}
        if self.loss_name == "softmax_cross_entropy":
            metrics["accuracy"] = float(np.mean(np.argmax(logits.value, axis=-1) == np.asarray(y)))
        if ctx.updates:
            metrics["updates"] = {name: _host(value) for name, value in ctx.updates.items()}
        return float(loss.value), grads, metrics

    def loss_and_gradients(self, params, x, y, out=None):
        """The workers' form: a gradient for every variable (zeros for the non-trainable ones)."""
        loss, grads, _ = self.step(params, (x, y))
        for v in self._variables:
            if not v.trainable:
                grads[v.name] = np.zeros(v.shape, self.dtype)
        if out is not None:
            for name, g in grads.items():
                out[name][...] = g
            return loss, out
        return loss, grads

    def predict(self, params, x):
        tensors = {v.name: constant(self._on_device(v, self._param(params, v))) for v in self._variables}
        logits = self.network.forward(tensors, self._inputs(x), Context(training=False, gpu_layers=self._gpu_layers))
        return self._outputs(ops.to_device(logits, False))

    def zero_labels(self, rows):
        """Zero labels in the head's shape: class ids, or a value per output (multi-label, regression)."""
        if self.loss_name == "softmax_cross_entropy":
            return np.zeros(rows, dtype=np.int32)
        return np.zeros((rows,) + tuple(self.output_shape()), dtype=self.dtype)

    # ------------------------------------------------ devices

    def use_gpu(self, layers):
        """Compute `layers` (names) on the current CuPy device, the others on the CPU; variables,
        activations and gradients cross between them where the layers do (`ops.to_device`)."""
        unknown = sorted(set(layers) - {layer.name for layer in self.network.layers})
        if unknown:
            raise InvalidArgumentError(f"no layers {unknown} in the model")
        self._gpu_layers = frozenset(layers)

    @property
    def gpu_layers(self):
        return sorted(self._gpu_layers)

    def _on_device(self, v, value):
        if self._layer_of[v.name] not in self._gpu_layers:
            return value
        import cupy
        return cupy.asarray(value)

    # ------------------------------------------------ parts, for pipeline stages (models/pipeline.py)

    def param(self, params, v):
        """params[v.name] checked against `v` and cast to the model's dtype."""
        return self._param(params, v)

    def input_tensor(self, x):
        """The network's input tensor(s) from arrays, checked against the input signature."""
        return self._inputs(x)

    def head_loss(self, logits, y):
        """The loss tensor of the head on `logits` for labels `y`."""
        return self._loss(logits, self._labels(y, logits))

    # ------------------------------------------------ checks

    def _param(self, params, v, rows=None):
        if rows is None:
            return np.asarray(checked_param(params, v), dtype=self.dtype)
        if v.name not in self._row_inputs:
            raise InvalidArgumentError(f"rows given for {v.name!r}, which is not a sparse table of the model "
                                       f"(those are {sorted(self._row_inputs)})")
        value = checked_param(params, dataclasses.replace(v, shape=(len(rows),) + tuple(v.shape[1:])))
        return np.asarray(value, dtype=self.dtype)

    def _inputs(self, x):
        signature = self.input_signature()
        if not isinstance(x, dict):
            if len(signature) != 1:
                raise InvalidArgumentError(f"the model has inputs {list(signature)}: pass a dict of arrays")
            x = {next(iter(signature)): x}
        tensors = {}
        for name, (shape, dtype) in signature.items():
            if name not in x:
                raise InvalidArgumentError(f"input {name!r} is missing (inputs: {list(signature)})")
            value = np.asarray(x[name])
            if value.shape[1:] != tuple(shape):
                raise InvalidArgumentError(f"input {name!r} has per-example shape {list(value.shape[1:])}, "
                                           f"the model expects {list(shape)}")
            value = value.astype(self.dtype if np.dtype(dtype).kind == "f" else dtype, copy=False)
            tensors[name] = constant(value, name)
        return tensors if len(tensors) > 1 else next(iter(tensors.values()))

    def _labels(self, y, logits):
        y = np.asarray(y)
        if len(y) != logits.shape[0]:
            raise InvalidArgumentError(f"{len(y)} labels for a batch of {logits.shape[0]}")
        if self.loss_name == "softmax_cross_entropy":
            classes = logits.shape[-1]
            y = y.astype(np.int64).reshape(-1)
            if y.size and (y.min() < 0 or y.max() >= classes):
                raise InvalidArgumentError(f"labels must be class ids in [0, {classes}), got {int(y.min())}..{int(y.max())}")
        return y


def _host(array):
    """A numpy array of `array` (from GPU memory if it is a CuPy array)."""
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else array
