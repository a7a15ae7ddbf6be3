"""A network of zmqflow layers and a loss head, as a model of the protocol (zmqflow.models.protocol).

    net = Sequential([Reshape((28, 28, 1)), Conv2D(32, 5, padding="same", activation="relu"),
                      MaxPool2D(), Flatten(), Dense(10)], input_shape=(784,))
    model = LayerModel(net, loss="softmax_cross_entropy")

Heads: `softmax_cross_entropy` (integer class ids; predict gives probabilities),
`sigmoid_cross_entropy` (0/1 targets per output, multi-label; predict gives
probabilities), `mse` and `huber` (regression; predict gives the values).

`backend` names the ops' backend on the CPU (zmqflow.models.kernels: numpy, numba);
`place` puts layers on other backends (a GPU's), as the worker's device placement decides.

Fitted to the train split (models/registry.py applies what a data spec's statistics give): the output
layer's bias starts from `set_output_bias` (log class priors, the target's mean), and a regression's
target is standardised with `standardize_target` (the loss sees (y - mean) / std, `predict` answers
in the target's own units), so evaluate, predict, serve and the gateway need no step of their own.
"""

import contextlib
import dataclasses
import itertools

import numpy as np

from zmqflow.common.cluster.device import DeviceSpec
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.variables import IndexedSlices, VariableSpec
from zmqflow.models import ops
from zmqflow.models.autograd import Tensor
from zmqflow.models.kernels import get_backend
from zmqflow.models.layers import Context, initial_value, weight_rng
from zmqflow.models.protocol import checked_param

_on_host = itertools.repeat(contextlib.nullcontext()).__next__
"""The scope of a model with no layer on a GPU: one reusable no-op context, at no cost per step."""

HEADS = {   # loss(logits, labels, kernels, metrics), outputs(logits, kernels)
    "softmax_cross_entropy": (ops.softmax_cross_entropy, lambda z, k: k.softmax(z.value)),
    "sigmoid_cross_entropy": (lambda z, t, k, m: ops.sigmoid_cross_entropy(z, t), lambda z, k: ops.sigmoid(z).value),
    "mse": (lambda z, t, k, m: ops.mean_squared_error(z, t), lambda z, k: z.value),
    "huber": (lambda z, t, k, m: ops.huber(z, t), lambda z, k: z.value),
}


class LayerModel:
    def __init__(self, network, loss="softmax_cross_entropy", dtype="float32", seed=0, backend="numpy"):
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
        self._trainable = [v for v in self._variables if v.trainable]
        self._layer_of = {f"{layer.name}/{w.name}": layer.name for layer in network.layers for w in layer.weights}
        self.kernels = get_backend(backend) if isinstance(backend, str) else backend
        self._signature = [(node.name, tuple(node.shape), self.dtype if np.dtype(node.dtype).kind == "f" else
                            np.dtype(node.dtype)) for node in network.inputs]   # floats in the model's dtype
        self.placements, self._placed, self._scope = [], {}, _on_host
        self._staging = None        # _Staged of the variables on a GPU, made by the first step after `place`
        self._steps = 0
        self.output_bias = None     # {variable name: first value}: set_output_bias
        self.target_scale = None    # (mean, std), each [outputs]: standardize_target

    # ------------------------------------------------ declarations

    def variables(self):
        return list(self._variables)

    def input_signature(self):
        return {node.name: (node.shape, node.dtype) for node in self.network.inputs}

    def output_shape(self):
        return self.network.output_shape

    def initial_values(self, seed=None):
        seed = self.seed if seed is None else seed
        values = {v.name: initial_value(v.initializer, v.shape, weight_rng(seed, v.name)).astype(self.dtype)
                  for v in self._variables}
        for name, value in (self.output_bias or {}).items():
            values[name] = value.astype(self.dtype)
        return values

    # ------------------------------------------------ fitted to the train split

    def set_output_bias(self, values):
        """Start the output layer's bias at `values` (one per output) instead of zeros: the log class
        priors of a classifier, the target's mean of a regression, so the first steps need not learn
        them. Returns whether it applied: the output layer is a Dense with a bias of that width."""
        layer = self.network.output.layer
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        if getattr(layer, "kind", None) != "dense" or not layer.use_bias or values.shape != (layer.units,):
            return False
        self.output_bias = {f"{layer.name}/{layer.weight_names[1]}": values}
        return True

    def standardize_target(self, mean, std):
        """Train a regression on (y - mean) / std and answer `predict` with outputs * std + mean: the
        target standardised with the train split's statistics, as its inputs are."""
        if self.loss_name not in ("mse", "huber"):
            raise InvalidArgumentError(f"only a regression's target is standardised; this model's loss is "
                                       f"{self.loss_name}")
        width = int(np.prod(self.output_shape()))
        mean, std = (np.asarray(v, dtype=self.dtype).reshape(-1) for v in (mean, std))
        if {mean.size, std.size} - {1, width}:
            raise InvalidArgumentError(f"the target's statistics give {mean.size} means and {std.size} deviations "
                                       f"for a model of {width} outputs")
        mean, std = np.broadcast_to(mean, (width,)).copy(), np.broadcast_to(std, (width,)).copy()
        if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all()):
            raise InvalidArgumentError(f"the target's statistics must be finite with a positive deviation, got mean "
                                       f"{mean.tolist()}, std {std.tolist()}")
        self.target_scale = (mean, std)

    # ------------------------------------------------ compute

    def sparse_rows(self, x):
        """{table: sorted unique row ids} of the sparse tables the batch `x` reads: a worker pulls
        only these rows and passes them to `step(..., rows=)`."""
        inputs = x if isinstance(x, dict) else {self.network.inputs[0].name: x}
        return {table: np.unique(np.asarray(inputs[name]).astype(np.int64)) for table, name in self._row_inputs.items()}

    stage_through_pinned = True
    """Whether a model placed on a GPU whose backend stages copies (CuPy's `PinnedStaging`) moves its variables in
    and its gradients out through pinned buffers (one copy each way) rather than one pageable copy per array.
    The answers are the same either way (tests/worker/test_devices.py compares them on a GPU)."""

    def step(self, params, batch, rows=None):
        """(mean loss, {trainable name: gradient}, metrics); metrics["updates"] holds the new
        values of non-trainable variables when the network has any. With `rows` (from
        `sparse_rows`), each of those tables in `params` holds only its rows `rows[table]`, in
        that order, and its gradient comes back as IndexedSlices over them."""
        staging = self._staged() if self._placed and not rows and self.stage_through_pinned else None
        if staging is None or not staging.lock.acquire(blocking=False):   # busy: another thread's step
            return self._step(params, batch, rows, None)
        try:
            return self._step(params, batch, rows, staging)
        finally:
            staging.lock.release()

    def _step(self, params, batch, rows, staging):
        x, y = batch
        rows = rows or {}
        tensors = self._tensors(params, rows, training=True, staging=staging)
        self._steps += 1
        ctx = Context(True, (self.seed, self._steps), rows, self.kernels, self._placed)
        metrics = {"loss": None}           # the head adds what it measures in passing (accuracy)
        with self._scope():
            logits = self.network.forward(tensors, self._inputs(x), ctx)     # the head on the host
            loss = self._loss(logits, self._labels(y, logits), self.kernels, metrics)
            loss.backward()
        grads, staged = {}, None
        if staging is not None:
            out = staging.gradients.gradients_out([tensors[v.name].grad for v in staging.trainable])
            staged = None if out is None else dict(zip((v.name for v in staging.trainable), out))
        for v in self._trainable:
            if staged and v.name in staged:
                grads[v.name] = staged[v.name]
                continue
            g = tensors[v.name].grad
            if g is None:
                g = np.zeros(v.shape, self.dtype)
            elif self._placed or g.dtype != self.dtype:
                g = self._host(v, g)
            grads[v.name] = IndexedSlices(rows[v.name], g) if rows and v.name in rows else g
        metrics["loss"] = float(loss.value)
        if ctx.updates:
            metrics["updates"] = {name: _host(value) for name, value in ctx.updates.items()}
        return metrics["loss"], grads, metrics

    def predict(self, params, x):
        tensors = self._tensors(params)
        with self._scope():
            outputs = self._outputs(self.network.forward(tensors, self._inputs(x), self.context()), self.kernels)
        if self.target_scale is None:
            return outputs
        mean, std = self.target_scale
        return (outputs * std + mean).astype(self.dtype, copy=False)

    def zero_labels(self, rows):
        """Zero labels in the head's shape: class ids, or a value per output (multi-label, regression)."""
        if self.loss_name == "softmax_cross_entropy":
            return np.zeros(rows, dtype=np.int32)
        return np.zeros((rows,) + tuple(self.output_shape()), dtype=self.dtype)

    # ------------------------------------------------ devices

    def place(self, kernels, placements=()):
        """Compute each layer named in `kernels` ({layer name: Kernels of zmqflow.models.kernels, e.g. a
        GPU's}) on that backend, the others on the model's; variables, activations and gradients move
        where layers' devices differ (`ops.move`). `placements` (with .layer.name and .device) are kept
        for reports (`devices`). Dense layers select their own GPU; the other layers compute on CuPy's
        current device, so those on GPUs must share one."""
        unknown = sorted(set(kernels) - {layer.name for layer in self.network.layers})
        if unknown:
            raise InvalidArgumentError(f"no layers {unknown} in the model")
        kinds = {layer.name: layer.kind for layer in self.network.layers}
        shared = {k.device: k for name, k in kernels.items() if k.device is not None and kinds[name] != "dense"}
        if len(shared) > 1:
            raise InvalidArgumentError(
                f"the layers use GPUs {sorted(index for _, index in shared)}: one worker runs a layer model on one "
                "GPU (Dense layers may spread over several; --towers splits batches over several)")
        self._placed = {name: k for name, k in kernels.items() if k is not self.kernels}
        self._staging = None
        self._scope = getattr(next(iter(shared.values()), None), "current", _on_host)
        self.placements = list(placements)

    @property
    def devices(self):
        """{layer name: device string} of the placement (empty when the model was not placed)."""
        return {p.layer.name: str(p.device) for p in self.placements}

    def context(self, training=False, seed=0, rows=None):
        """The Context of a forward pass on the model's backends."""
        return Context(training=training, seed=seed, rows=rows, kernels=self.kernels, placed=self._placed)

    def _staged(self):
        """The _Staged of this placement (made once), or None: its variables must all be on one GPU whose
        backend has `staging`, which every Dense layer spread over other GPUs rules out."""
        if self._staging is None:
            self._staging = False
            backends = {id(k): k for k in self._placed.values() if hasattr(k, "staging")}
            if len(backends) == 1:
                gpu = next(iter(backends.values()))
                on_gpu = [v for v in self._variables if self._placed.get(self._layer_of[v.name]) is gpu]
                trainable = [v for v in on_gpu if v.trainable]
                if on_gpu:
                    self._staging = _Staged(on_gpu, trainable, gpu.staging([v.shape for v in on_gpu], self.dtype),
                                            gpu.staging([v.shape for v in trainable], self.dtype))
        return self._staging or None

    def _on_device(self, v, value):
        kernels = self._placed.get(self._layer_of[v.name]) if self._placed else None
        return value if kernels is None else kernels.to_device(value)

    def _host(self, v, value):
        """A gradient in host memory, in the model's dtype."""
        kernels = self._placed.get(self._layer_of[v.name]) if self._placed else None
        value = value if kernels is None else kernels.to_host(value)
        return value if value.dtype == self.dtype else value.astype(self.dtype)

    # ------------------------------------------------ parts, for pipeline stages (models/stages.py)

    def assign_devices(self, devices):
        """Put the layers named in `devices` ({layer name: device string}) on those devices, as if built with
        `device=`: how a model spec's `pipeline` field splits a model built without device strings."""
        layers = {layer.name: layer for layer in self.network.layers}
        unknown = sorted(set(devices) - set(layers))
        if unknown:
            raise InvalidArgumentError(f"no layers {unknown} in the model (its layers: {', '.join(layers)})")
        for name, device in devices.items():
            try:
                DeviceSpec.from_string(device)
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"layer {name}: {exc}") from None
            layers[name].device = device
        self._variables = [dataclasses.replace(v, device=layers[self._layer_of[v.name]].device)
                           for v in self._variables]
        self._trainable = [v for v in self._variables if v.trainable]
        self._staging = None

    def param(self, params, v):
        """params[v.name] checked against `v` and cast to the model's dtype."""
        return self._param(params, v)

    def input_tensor(self, x):
        """The network's input tensor(s) from arrays, checked against the input signature."""
        return self._inputs(x)

    def head_loss(self, logits, y):
        """The loss tensor of the head on `logits` (on the host) for labels `y`."""
        return self._loss(logits, self._labels(y, logits), self.kernels, None)

    # ------------------------------------------------ checks

    def _tensors(self, params, rows=None, training=False, staging=None):
        """{variable name: Tensor} of `params` on their layers' devices; when training, the trainable
        ones are variables (they collect a gradient), the others constants. With `staging`, its variables
        go in through its pinned buffer, in one copy."""
        if staging is not None:
            return self._staged_tensors(params, training, staging)
        tensors, plain = {}, type(params) is dict and not rows and not self._placed
        for v in self._variables:
            value = params.get(v.name) if plain else None
            if not (type(value) is np.ndarray and value.shape == v.shape and value.dtype == self.dtype):
                value = self._on_device(v, self._param(params, v, rows.get(v.name) if rows else None))
            tensors[v.name] = Tensor(value, (), None, training and v.trainable, v.name)
        return tensors    # (an ndarray of the right shape and dtype, as a worker passes, needs no more checks)

    def _staged_tensors(self, params, training, staging):
        """_tensors with the staging's variables copied in together (checked and cast as one by one)."""
        values = staging.variables_in.variables_in([self._param(params, v) for v in staging.variables])
        staged = dict(zip((v.name for v in staging.variables), values))
        tensors = {}
        for v in self._variables:
            value = staged.get(v.name)
            if value is None:
                value = self._on_device(v, self._param(params, v))
            tensors[v.name] = Tensor(value, (), None, training and v.trainable, v.name)
        return tensors

    def _param(self, params, v, rows=None):
        if rows is None:
            return np.asarray(checked_param(params, v), dtype=self.dtype)
        if v.name not in self._row_inputs:
            raise InvalidArgumentError(f"rows given for {v.name!r}, which is not a sparse table of the model "
                                       f"(those are {sorted(self._row_inputs)})")
        value = checked_param(params, dataclasses.replace(v, shape=(len(rows),) + tuple(v.shape[1:])))
        return np.asarray(value, dtype=self.dtype)

    def _inputs(self, x):
        if not isinstance(x, dict):
            if len(self._signature) != 1:
                raise InvalidArgumentError(f"the model has inputs {list(self._signature)}: pass a dict of arrays")
            return _input(x, *self._signature[0])
        for name, _, _ in self._signature:
            if name not in x:
                raise InvalidArgumentError(f"input {name!r} is missing (inputs: {[s[0] for s in self._signature]})")
        tensors = {name: _input(x[name], name, shape, dtype) for name, shape, dtype in self._signature}
        return tensors if len(tensors) > 1 else next(iter(tensors.values()))

    def _labels(self, y, logits):
        """The labels as the head takes them; the backend checks that class ids are in range."""
        y = np.asarray(y)
        if len(y) != len(logits.value):
            raise InvalidArgumentError(f"{len(y)} labels for a batch of {len(logits.value)}")
        if self.loss_name == "softmax_cross_entropy":
            if y.dtype.kind not in "iu":
                raise InvalidArgumentError(f"labels must be integer class ids, got {y.dtype}")
            return y if y.ndim == 1 else y.reshape(-1)
        if self.target_scale is not None:
            mean, std = self.target_scale
            return ((y.astype(self.dtype, copy=False) - mean) / std).astype(self.dtype, copy=False)
        return y


@dataclasses.dataclass
class _Staged:
    """A model's variables on one GPU and the stagings (models/kernels/cupy_kernels.py's PinnedStaging) that
    copy them in and their gradients out; one step at a time uses them (`lock`)."""
    variables: list
    trainable: list
    variables_in: object
    gradients: object

    @property
    def lock(self):
        return self.variables_in.lock


def _input(value, name, shape, dtype):
    """A constant tensor of input `name`'s array, checked against its per-example shape."""
    value = np.asarray(value)
    if value.ndim == 0 or len(value) == 0:
        raise InvalidArgumentError(f"input {name!r} holds no examples (shape {list(value.shape)})")
    if value.shape[1:] != shape:
        raise InvalidArgumentError(f"input {name!r} has per-example shape {list(value.shape[1:])}, "
                                   f"the model expects {list(shape)}")
    return Tensor(value.astype(dtype, copy=False), (), None, False, name)


def _host(array):
    """A numpy array of `array` (from GPU memory if it is a CuPy array): BatchNorm's updates."""
    return array.get() if hasattr(array, "get") and not isinstance(array, np.ndarray) else array
