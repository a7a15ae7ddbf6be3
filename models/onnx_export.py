"""ONNX graphs of zmqflow's own models: networks of the layer library (LayerModel, the built-in MLP too).

    proto = to_onnx(model, params, name="mnist", step=1200)     # an onnx.ModelProto, checked

The graph computes what a model server answers for a tensor request: inference semantics
(Dropout is the identity, BatchNorm uses its moving statistics), then the head's
probabilities (softmax or sigmoid) or the regressed values, as float32. Each layer kind has
an emitter written from the layer's own forward code rather than traced, so a layer without
one is refused by name instead of exported wrong. zmqflow's images are NHWC while ONNX's Conv
and pooling take NCHW: a Transpose goes in where a run of convolutions and poolings starts
and another where it ends, so Flatten and Reshape keep zmqflow's element order. Raw records'
preprocessing (a data spec's statistics and vocabularies) stays outside the graph: it takes
the model's input tensors, named by its input signature, with a dynamic batch dimension.
Models adapted from PyTorch or JAX export through their own framework (`onnx_exporter`).
"""

import dataclasses

import numpy as np

from zmqflow.common.errors import FailedPreconditionError, InvalidArgumentError, UnimplementedError
from zmqflow.models import conv_ops, layers, ops
from zmqflow.models.protocol import input_signature

DEFAULT_OPSET = 17
"""The first opset with LayerNormalization; onnxruntime 1.14 (2023) and later run it."""
MIN_OPSET = 17
BATCH = "batch"
TO_CHANNELS_FIRST, TO_CHANNELS_LAST = [0, 3, 1, 2], [0, 2, 3, 1]


def onnx_module():
    """The `onnx` package, or FailedPreconditionError saying which extra installs it."""
    try:
        import onnx
    except ImportError:
        raise FailedPreconditionError("ONNX export needs the onnx package: pip install 'zmqflow[onnx]'") from None
    return onnx


def output_name(model):
    """The graph's output: `probabilities` (a classifier's head, as ModelClient.predict calls them) or
    `predictions` (a regression's values)."""
    regression = getattr(model, "loss_name", None) in ("mse", "huber")
    return "predictions" if regression else "probabilities"


def to_onnx(model, params, opset=DEFAULT_OPSET, name="model", step=None, version="", extra_metadata=None):
    """The checked onnx.ModelProto of `model` with `params` ({variable: array}); metadata props name the
    model, the zmqflow `version` (the caller's: models sit below the package root) and the step.
    UnimplementedError for a model or layer without a mapping."""
    onnx = onnx_module()
    highest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= int(opset) <= highest:
        raise InvalidArgumentError(f"opset {opset} is not supported: use {MIN_OPSET}..{highest} (this onnx package)")
    _refuse_adapted(model)
    graph = GraphBuilder(onnx, np.dtype(getattr(model, "dtype", "float32")))
    inputs = {input_name: graph.add_input(input_name, shape, dtype)
              for input_name, (shape, dtype) in input_signature(model).items()}
    if not hasattr(model, "network"):
        raise UnimplementedError(f"{type(model).__name__} has no ONNX mapping: zmqflow exports models built from "
                                 "its layers (LayerModel, the built-in models among them)")
    out = _head(graph, _network(graph, model.network, params, inputs), model.loss_name,
                getattr(model, "target_scale", None))
    graph.add_output(out, output_name(model), tuple(model.output_shape()))
    metadata = {"zmqflow.model": name, "zmqflow.version": version, "zmqflow.step": "" if step is None else str(step),
                **(extra_metadata or {})}
    proto = graph.model(name, opset, metadata, version)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _refuse_adapted(model):
    exporter = getattr(model, "onnx_exporter", None)
    if exporter:
        raise UnimplementedError(f"{type(model).__name__} is adapted from {model.framework}: zmqflow exports only "
                                 f"models built from its own layers; export this one from {model.framework} with "
                                 f"{exporter}")


# ------------------------------------------------ the graph under construction


@dataclasses.dataclass(frozen=True)
class Value:
    """A tensor of the graph: its name, whether it is an image held channels-first (NCHW, inside a run
    of convolutions and poolings) rather than zmqflow's NHWC, and whether it holds integers."""

    name: str
    channels_first: bool = False
    integer: bool = False


class GraphBuilder:
    """Nodes, initializers, inputs and outputs of one graph, with unique names."""

    def __init__(self, onnx, dtype):
        self.onnx, self.helper, self.dtype = onnx, onnx.helper, dtype
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self._taken, self._transposed = set(), {}

    def fresh(self, base):
        name, n = base, 0
        while name in self._taken:
            n += 1
            name = f"{base}_{n}"
        self._taken.add(name)
        return name

    def constant(self, base, array):
        name = self.fresh(base)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def weight(self, base, array):
        """A weight or statistic in the model's dtype."""
        return self.constant(base, np.asarray(array, dtype=self.dtype))

    def op(self, op_type, inputs, base, **attributes):
        out = self.fresh(base)
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], name=out, **attributes))
        return out

    def add_input(self, name, shape, dtype):
        self._taken.add(name)
        dtype = np.dtype(dtype)
        self.inputs.append(self.helper.make_tensor_value_info(
            name, self.helper.np_dtype_to_tensor_dtype(dtype), [BATCH, *shape]))
        if dtype.kind in "iu":
            return Value(name, integer=True)
        if dtype != self.dtype:       # LayerModel computes floats in its own dtype
            return Value(self.op("Cast", [name], f"{name}/cast", to=self._elem_type()))
        return Value(name)

    def add_output(self, value, name, shape):
        source = self.channels_last(self.floating(value)).name
        if self.dtype != np.float32:   # a server answers float32
            source = self.op("Cast", [source], f"{name}/float32", to=self.onnx.TensorProto.FLOAT)
        self._taken.add(name)
        self.nodes.append(self.helper.make_node("Identity", [source], [name], name=name))
        self.outputs.append(self.helper.make_tensor_value_info(name, self.onnx.TensorProto.FLOAT, [BATCH, *shape]))

    def floating(self, value):
        """`value` in the model's float dtype (numpy promotes integers meeting floats)."""
        if not value.integer:
            return value
        return Value(self.op("Cast", [value.name], f"{value.name}/float", to=self._elem_type()), value.channels_first)

    def channels_first(self, value):
        return self._transpose(value, True)

    def channels_last(self, value):
        return self._transpose(value, False)

    def _transpose(self, value, first):
        if value.channels_first == first:
            return value
        key = (value.name, first)
        if key not in self._transposed:
            perm = TO_CHANNELS_FIRST if first else TO_CHANNELS_LAST
            name = self.op("Transpose", [value.name], f"{value.name}/{'nchw' if first else 'nhwc'}", perm=perm)
            self._transposed[key] = Value(name, first, value.integer)
        return self._transposed[key]

    def _elem_type(self):
        return self.helper.np_dtype_to_tensor_dtype(self.dtype)

    def model(self, name, opset, metadata, version):
        graph = self.helper.make_graph(self.nodes, name, self.inputs, self.outputs, self.initializers)
        opsets = [self.helper.make_opsetid("", int(opset))]
        proto = self.helper.make_model(graph, opset_imports=opsets, producer_name="zmqflow", producer_version=version,
                                       ir_version=self.helper.find_min_ir_version_for(opsets))
        self.helper.set_model_props(proto, {k: str(v) for k, v in metadata.items()})
        return proto


# ------------------------------------------------ layer networks


def _network(graph, network, params, inputs):
    values = {}
    for node in network.nodes:
        if node.layer is None:
            values[id(node)] = inputs[node.name]
            continue
        layer = node.layer
        emit = EMITTERS.get(type(layer))   # the class itself: a subclass may compute something else
        if emit is None:
            raise UnimplementedError(f"layer {layer.name!r} ({type(layer).__name__}) has no ONNX mapping; layers that "
                                     f"export: {', '.join(sorted(c.__name__ for c in EMITTERS))}")
        args = [values[id(i)] for i in node.inputs]
        weights = {w.name: params[f"{layer.name}/{w.name}"] for w in layer.weights}
        values[id(node)] = emit(graph, layer, weights, args if len(args) > 1 else args[0])
    return values[id(network.output)]


def _dense(graph, layer, w, x):
    x = graph.channels_last(graph.floating(x))
    kernel, bias = layer.weight_names
    y = graph.op("MatMul", [x.name, graph.weight(f"{layer.name}/{kernel}", w[kernel])], f"{layer.name}/matmul")
    if layer.use_bias:
        y = graph.op("Add", [y, graph.weight(f"{layer.name}/{bias}", w[bias])], f"{layer.name}/add")
    return _layer_activation(graph, Value(y), layer)


def _conv2d(graph, layer, w, x):
    x = graph.channels_first(graph.floating(x))
    k, s = layer.kernel_size, layer.strides
    kernel = np.transpose(w["kernel"], (3, 2, 0, 1))     # [kh, kw, in, out] -> ONNX's [out, in, kh, kw]
    inputs = [x.name, graph.weight(f"{layer.name}/kernel", kernel)]
    if layer.use_bias:
        inputs.append(graph.weight(f"{layer.name}/bias", w["bias"]))
    y = graph.op("Conv", inputs, f"{layer.name}/conv", kernel_shape=[k, k], strides=[s, s],
                 pads=_pads(layer.input_shape, k, s, layer.padding))
    return _layer_activation(graph, Value(y, channels_first=True), layer)


def _pads(input_shape, window, stride, padding):
    """ONNX pads [top, left, bottom, right] of TensorFlow's padding (conv_ops.output_size)."""
    (_, (top, bottom)), (_, (left, right)) = (conv_ops.output_size(n, window, stride, padding) for n in input_shape[:2])
    return [top, left, bottom, right]


def _pool(op_type, **attributes):
    def emit(graph, layer, w, x):
        x = graph.channels_first(graph.floating(x))
        k, s = layer.pool_size, layer.strides
        return Value(graph.op(op_type, [x.name], f"{layer.name}/pool", kernel_shape=[k, k], strides=[s, s],
                              pads=_pads(layer.input_shape, k, s, layer.padding), **attributes), channels_first=True)
    return emit


def _reshape(graph, layer, w, x):
    """Flatten and Reshape: zmqflow's (NHWC, row-major) element order, the batch dimension kept (0)."""
    x = graph.channels_last(x)
    shape = graph.constant(f"{layer.name}/shape", np.array((0,) + tuple(layer.output_shape), np.int64))
    return Value(graph.op("Reshape", [x.name, shape], f"{layer.name}/reshape"), integer=x.integer)


def _embedding(graph, layer, w, ids):
    ids = graph.channels_last(ids)
    if not ids.integer:
        ids = Value(graph.op("Cast", [ids.name], f"{layer.name}/ids", to=graph.onnx.TensorProto.INT64), integer=True)
    table = graph.weight(f"{layer.name}/embeddings", w["embeddings"])
    return Value(graph.op("Gather", [table, ids.name], f"{layer.name}/gather", axis=0))


def _dropout(graph, layer, w, x):
    return x        # inference: the identity (inverted dropout scaled while training)


def _activation_layer(graph, layer, w, x):
    return _layer_activation(graph, graph.floating(x), layer)


def _layer_norm(graph, layer, w, x):
    x = graph.channels_last(graph.floating(x))
    gamma, beta = graph.weight(f"{layer.name}/gamma", w["gamma"]), graph.weight(f"{layer.name}/beta", w["beta"])
    return Value(graph.op("LayerNormalization", [x.name, gamma, beta], f"{layer.name}/norm", axis=-1,
                          epsilon=layer.epsilon))


def _batch_norm(graph, layer, w, x):
    """Inference with the moving statistics, in BatchNorm.forward's order: (x - mean) * 1/sqrt(var + eps)
    * gamma + beta, each constant shaped [C, 1, 1] when the image is held channels-first."""
    x = graph.floating(x)
    shape = (-1, 1, 1) if x.channels_first else (-1,)
    mean = np.asarray(w["moving_mean"], graph.dtype)
    inverse = (1.0 / np.sqrt(np.asarray(w["moving_variance"], graph.dtype) + layer.epsilon)).astype(graph.dtype)
    y = x.name
    for op_type, part, value in (("Sub", "moving_mean", mean), ("Mul", "inverse_std", inverse),
                                 ("Mul", "gamma", w["gamma"]), ("Add", "beta", w["beta"])):
        y = graph.op(op_type, [y, graph.weight(f"{layer.name}/{part}", np.reshape(value, shape))],
                     f"{layer.name}/{part}")
    return Value(y, channels_first=x.channels_first)


def _concatenate(graph, layer, w, xs):
    parts = [graph.channels_last(graph.floating(x)).name for x in xs]
    return Value(graph.op("Concat", parts, f"{layer.name}/concat", axis=-1))


def _add(graph, layer, w, xs):
    parts = [graph.channels_last(graph.floating(x)).name for x in xs]
    return Value(graph.op("Sum", parts, f"{layer.name}/sum"))


EMITTERS = {layers.Dense: _dense, layers.Conv2D: _conv2d, layers.MaxPool2D: _pool("MaxPool"),
            layers.AvgPool2D: _pool("AveragePool", count_include_pad=0), layers.Flatten: _reshape,
            layers.Reshape: _reshape, layers.Embedding: _embedding, layers.Dropout: _dropout,
            layers.Activation: _activation_layer, layers.LayerNorm: _layer_norm, layers.BatchNorm: _batch_norm,
            layers.Concatenate: _concatenate, layers.Add: _add}
"""Layer class -> emitter(graph, layer, {weight: array}, input Value(s)) -> output Value."""


# ------------------------------------------------ activations and heads

_GELU_C = np.sqrt(2.0 / np.pi)


def _layer_activation(graph, x, layer):
    names = {id(function): name for name, function in ops.ACTIVATIONS.items()}
    if id(layer.activation) not in names:
        raise UnimplementedError(f"layer {layer.name!r}: its activation {layer.activation!r} has no ONNX mapping; "
                                 f"activations that export: {', '.join(str(k) for k in ops.ACTIVATIONS if k)}")
    return _activation(graph, x, names[id(layer.activation)], layer.name)


def _activation(graph, x, name, scope):
    if name in (None, "linear"):
        return x
    simple = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh"}
    if name in simple:
        return Value(graph.op(simple[name], [x.name], f"{scope}/{name}"), x.channels_first)
    if name == "softmax":
        return Value(graph.op("Softmax", [graph.channels_last(x).name], f"{scope}/softmax", axis=-1))
    if name == "gelu":
        return Value(_gelu(graph, x.name, scope), x.channels_first)
    raise UnimplementedError(f"layer {scope!r}: activation {name!r} has no ONNX mapping")


def _gelu(graph, x, scope):
    """ops.gelu's tanh approximation, 0.5 x (1 + tanh(c (x + 0.044715 x^3))), op by op (any opset)."""
    def scalar(part, value):
        return graph.weight(f"{scope}/gelu/{part}", np.array(value))
    cube = graph.op("Mul", [x, graph.op("Mul", [x, x], f"{scope}/gelu/square")], f"{scope}/gelu/cube")
    inner = graph.op("Add", [x, graph.op("Mul", [cube, scalar("k", 0.044715)], f"{scope}/gelu/k_cube")],
                     f"{scope}/gelu/sum")
    t = graph.op("Tanh", [graph.op("Mul", [inner, scalar("c", _GELU_C)], f"{scope}/gelu/inner")], f"{scope}/gelu/tanh")
    half_x = graph.op("Mul", [x, scalar("half", 0.5)], f"{scope}/gelu/half_x")
    return graph.op("Mul", [half_x, graph.op("Add", [t, scalar("one", 1.0)], f"{scope}/gelu/one_plus")],
                    f"{scope}/gelu")


def _head(graph, logits, loss, target_scale=None):
    """What LayerModel.predict answers from the network's output (layer_model.HEADS): a standardised
    regression target (`target_scale`, (mean, std)) back in its own units."""
    logits = graph.channels_last(graph.floating(logits))
    if loss == "softmax_cross_entropy":
        return Value(graph.op("Softmax", [logits.name], "head/softmax", axis=-1))
    if loss == "sigmoid_cross_entropy":
        return Value(graph.op("Sigmoid", [logits.name], "head/sigmoid"))
    if target_scale is None:
        return logits
    mean, std = target_scale
    scaled = graph.op("Mul", [logits.name, graph.weight("head/target_std", std)], "head/target_std")
    return Value(graph.op("Add", [scaled, graph.weight("head/target_mean", mean)], "head/target_mean"))

