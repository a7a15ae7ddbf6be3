"""Containers of layers: `Sequential` (a stack) and `Network` (Keras' functional `Model(inputs, outputs)`).

Both build every layer once for the input shapes, give unnamed layers Keras'
names in order (`dense`, `dense_1`, `conv2d`, ...), and run a forward pass
over tensors: `network.forward(params, inputs, ctx)`.
"""

from zmqflow.models import ops
from zmqflow.models.layers import Input, Node


class Network:
    """A graph of layers from `inputs` (Input nodes) to one `output` node."""

    def __init__(self, inputs, outputs, name="network"):
        self.inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if isinstance(outputs, (list, tuple)):
            if len(outputs) != 1:
                raise ValueError("a network has one output (a head computes the loss from it)")
            outputs = outputs[0]
        self.output, self.name = outputs, name
        for i, node in enumerate(self.inputs):
            if not isinstance(node, Node) or node.layer is not None:
                raise TypeError(f"inputs[{i}] is not an Input(...)")
            node.name = node.name or ("input" if len(self.inputs) == 1 else f"input_{i}")
        self.nodes = self._order()
        self.layers = [n.layer for n in self.nodes if n.layer is not None]
        position = {id(node): i for i, node in enumerate(self.nodes)}
        self._plan = [(node.layer, node.name, [position[id(i)] for i in node.inputs]) for node in self.nodes]
        self._name_layers()
        for node in self.nodes:
            if node.layer is not None:
                shapes = [i.shape for i in node.inputs]
                try:
                    node.shape = tuple(node.layer.build(shapes if len(shapes) > 1 else shapes[0]))
                except ValueError as exc:
                    raise ValueError(f"layer {node.layer.name}: {exc}") from None

    def _order(self):
        """The nodes from inputs to output, each after the nodes it reads."""
        order, seen, used = [], set(), set()

        def visit(node, path):
            if id(node) in seen:
                return
            if node in path:
                raise ValueError("the network has a cycle")
            for parent in node.inputs:
                visit(parent, path + [node])
            if node.layer is None and node not in self.inputs:
                raise ValueError(f"the output depends on an Input ({node.name or node.shape}) not in `inputs`")
            if node.layer is not None:
                if id(node.layer) in used:
                    raise ValueError(f"layer {node.layer.name or node.layer.kind} is used twice; shared layers are "
                                     "not supported, make two")
                used.add(id(node.layer))
            seen.add(id(node))
            order.append(node)
        visit(self.output, [])
        return order

    def _name_layers(self):
        taken = {layer.name for layer in self.layers if layer.name}
        counts = {}
        for layer in self.layers:
            if layer.name:
                continue
            while True:
                n = counts.get(layer.kind, 0)
                counts[layer.kind] = n + 1
                candidate = layer.kind if n == 0 else f"{layer.kind}_{n}"
                if candidate not in taken:
                    break
            layer.name = candidate
            taken.add(candidate)
        names = [layer.name for layer in self.layers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"layer names must be unique, {duplicates} repeat")

    @property
    def output_shape(self):
        return self.output.shape

    def forward(self, params, inputs, ctx):
        """`inputs`: {input name: Tensor} (or one Tensor for one input) -> the output Tensor. Each layer
        computes on its backend (`ctx.kernels(layer)`); tensors move where consecutive layers' devices
        differ, and the output comes back to `ctx.host`."""
        if not isinstance(inputs, dict):
            inputs = {self.inputs[0].name: inputs}
        values, where = [], []      # of self.nodes, by position; the output is the last node
        for layer, name, positions in self._plan:
            if layer is None:
                value, here = inputs[name], ctx.host
            else:
                here, args = ctx.kernels(layer), []
                for i in positions:
                    args.append(values[i] if where[i] is here else ops.move(values[i], where[i], here))
                value = layer.forward(params, args if len(args) > 1 else args[0], ctx)
            values.append(value)
            where.append(here)
        return value if here is ctx.host else ops.move(value, here, ctx.host)

    def summary(self):
        """One line per layer: name, kind, output shape."""
        lines = [f"{n.name}: input {list(n.shape)}" for n in self.inputs]
        return "\n".join(lines + [layer.describe() for layer in self.layers])


class Sequential(Network):
    """Layers applied one after the other to one input of per-example shape `input_shape`."""

    def __init__(self, layers, input_shape, input_dtype="float32", name="sequential"):
        if not layers:
            raise ValueError("Sequential needs at least one layer")
        node = inputs = Input(input_shape, dtype=input_dtype, name="input")
        for layer in layers:
            node = layer(node)
        super().__init__(inputs, node, name)
