"""A layer model split into pipeline stages by its layers' device strings (the seeds' vertical split).

    Sequential([Dense(1024, activation="relu", device="/job:worker/task:0"),
                Dense(1024, activation="relu", device="/job:worker/task:1"), Dense(10)], ...)

Layers on `/job:worker/task:N` run on worker N; a layer without a task runs where the layer
before it does (the first on task 0). The tasks must form contiguous blocks along a chain of
layers: stage k's output is stage k+1's only input. Each `Stage` computes its part of a
micro-batch, keeps the tape, and later runs the backward pass from the gradient of its output
that the next stage sends back. The last stage also owns the loss head. No sockets here:
services/worker/stage_link.py moves the activations and gradients between workers.
"""

import dataclasses

import numpy as np

from zmqflow.common.cluster.device import DeviceSpec
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.autograd import constant, variable


def is_pipelined(model):
    """True when some layer of a layer model names a worker task (`/job:worker/task:N`)."""
    network = getattr(model, "network", None)
    return network is not None and any(layer.device and DeviceSpec.from_string(layer.device).task is not None
                                       for layer in network.layers)


def stage_count(model):
    """How many workers a model's layers run on: 1 without a pipeline."""
    return len(split_stages(model)) if is_pipelined(model) else 1


def split_stages(model):
    """The `Stage`s of a LayerModel whose layers name worker tasks; InvalidArgument naming the layer
    when the split is not a chain of contiguous blocks."""
    network = model.network
    nodes = [n for n in network.nodes if n.layer is not None]
    if len(network.inputs) != 1 or any(len(n.inputs) != 1 for n in nodes) or any(
            n.inputs[0] is not (nodes[i - 1] if i else network.inputs[0]) for i, n in enumerate(nodes)):
        raise InvalidArgumentError("a model split over workers must be a chain of layers (a Sequential): each "
                                   "stage's output is the next stage's only input")
    blocks, task = [], 0
    for node in nodes:
        spec = DeviceSpec.from_string(node.layer.device) if node.layer.device else None
        if spec is not None and spec.task is not None:
            if spec.job not in (None, "worker"):
                raise InvalidArgumentError(f"layer {node.layer.name}: device {node.layer.device!r} names job "
                                           f"{spec.job!r}; pipeline stages run on the worker job")
            task = spec.task
        if blocks and blocks[-1][0] == task:
            blocks[-1][1].append(node.layer)
        elif any(t == task for t, _ in blocks):
            raise InvalidArgumentError(f"layer {node.layer.name} goes back to /job:worker/task:{task}; a stage's "
                                       "layers must be contiguous")
        else:
            blocks.append((task, [node.layer]))
    if [t for t, _ in blocks] != list(range(len(blocks))):
        raise InvalidArgumentError(f"pipeline stages run on worker tasks {[t for t, _ in blocks]}: they must be "
                                   "0, 1, ... in the order of the layers")
    variables = {v.name: v for v in model.variables()}
    return [Stage(model, k, layers, [variables[f"{layer.name}/{w.name}"] for layer in layers for w in layer.weights],
                  last=k == len(blocks) - 1) for k, (_, layers) in enumerate(blocks)]


@dataclasses.dataclass
class Tape:
    """One micro-batch's forward pass through a stage, kept for its backward pass."""

    inputs: object
    output: object
    params: dict
    updates: dict


class Stage:
    """Layers [first..last] of the model, on worker task `index`."""

    def __init__(self, model, index, layers, variables, last):
        self.model, self.index, self.layers, self.variables, self.last = model, index, layers, variables, last

    @property
    def variable_names(self):
        return [v.name for v in self.variables]

    def forward(self, params, x, seed=0, training=True):
        """(output array, tape) for input `x` (the model's input on stage 0, else the previous stage's output)."""
        tensors = {v.name: (variable if v.trainable else constant)(self.model.param(params, v), v.name)
                   for v in self.variables}
        a = inputs = self.model.input_tensor(x) if self.index == 0 else variable(np.asarray(x, self.model.dtype))
        ctx = self.model.context(training=training, seed=seed)
        for layer in self.layers:
            a = layer.forward(tensors, a, ctx)
        return a.value, Tape(inputs, a, tensors, ctx.updates)

    def loss(self, tape, y, weight):
        """Last stage: the head's loss on the tape's output times `weight` (the micro-batch's share of the
        batch), and the backward pass from it: the micro-batches' losses and gradients add up to the batch's."""
        loss = self.model.head_loss(tape.output, y)
        loss.backward(np.asarray(weight, loss.value.dtype))
        return float(loss.value) * weight

    def backward(self, tape, grad):
        """Backward from d loss / d output (`grad`); call once per tape."""
        tape.output.backward(np.asarray(grad, tape.output.value.dtype))

    def gradients(self, tape):
        """({trainable variable: gradient}, d loss / d input or None on stage 0) after backward/loss."""
        grads = {v.name: (np.zeros(v.shape, self.model.dtype) if tape.params[v.name].grad is None
                          else tape.params[v.name].grad) for v in self.variables if v.trainable}
        upstream = None
        if self.index > 0:
            g = tape.inputs.grad
            upstream = np.zeros(tape.inputs.value.shape, self.model.dtype) if g is None else g
        return grads, upstream
