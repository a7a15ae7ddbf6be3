"""A layer model split into pipeline stages by its layers' device strings (the seeds' vertical split).

    Sequential([Dense(1024, activation="relu", device="/job:worker/task:0"),
                Dense(1024, activation="relu", device="/job:worker/task:1"), Dense(10)], ...)

Layers on `/job:worker/task:N` run on worker N; a layer without a task runs where the layer it reads
does (its first input's; a layer reading the model's input, on task 0). A chain is the simplest split;
a functional model (`Model(inputs, outputs)`) may branch and join: an input stage feeding two branch
stages whose outputs a join stage adds or concatenates is a DAG of stages. The split is checked: the
stages' graph is acyclic, task 0 is the one input stage (only it reads the model's inputs), the stage
of the model's output is the one output stage, and the tasks are 0, 1, ... Each `Stage` computes its
part of a micro-batch from the tensors its upstream stages send, keeps the tape, and later runs the
backward pass from the gradients its downstream stages send back (summed where one tensor feeds several
stages). The output stage also owns the loss head. No sockets here: services/worker/stage_link.py moves
the activations and gradients between workers.
"""

import dataclasses
from collections.abc import Mapping

import numpy as np

from zmqflow.common.cluster.device import DeviceSpec
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.autograd import backward_all, constant, variable


def is_pipelined(model):
    """True when some layer of a layer model names a worker task (`/job:worker/task:N`)."""
    network = getattr(model, "network", None)
    return network is not None and any(layer.device and DeviceSpec.from_string(layer.device).task is not None
                                       for layer in network.layers)


def stage_count(model):
    """How many workers a model's layers run on: 1 without a pipeline."""
    return len(split_stages(model)) if is_pipelined(model) else 1


def split_at(model, stages):
    """`model` with the layers named in `stages` ({layer name: worker task}) on those tasks, as if each was
    built with `device="/job:worker/task:N"`; the layers not named follow the layer they read. A model
    spec's `pipeline` field (`--model-opt "pipeline={hidden2: 1}"`) splits this way a model built without
    device strings: a built-in, or a file's."""
    if not stages:
        return model
    if not isinstance(stages, Mapping) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                  for t in stages.values()):
        raise InvalidArgumentError(f"model spec field 'pipeline' maps layer names to worker tasks (0, 1, ...), "
                                   f"{{LAYER: TASK, ...}}; got {stages!r}")
    if not callable(getattr(model, "assign_devices", None)):
        raise InvalidArgumentError(f"model spec field 'pipeline': a {type(model).__name__} has no layers to split "
                                   "over workers (a model of zmqflow's layers has)")
    model.assign_devices({name: f"/job:worker/task:{task}" for name, task in stages.items()})
    split_stages(model)     # the split is checked here, naming the layer, before anything starts
    return model


def stage_links(model):
    """{stage: [the stages it sends activations to]} of a pipelined model ({} without a pipeline): what a
    launcher wires (`--pipeline-next STAGE=ENDPOINT` for each)."""
    return {s.index: list(s.downstream) for s in split_stages(model)} if is_pipelined(model) else {}


def split_stages(model):
    """The `Stage`s of a LayerModel whose layers name worker tasks, in task order; InvalidArgument naming
    the layer or stage when the split cannot run (a cycle between stages, a later stage reading the
    model's input, tasks that are not 0, 1, ...)."""
    network = model.network
    nodes = [n for n in network.nodes if n.layer is not None]
    task_of, edges = {}, {}              # id(node) -> task; (from task, to task) -> first layer reading
    for node in nodes:
        spec = DeviceSpec.from_string(node.layer.device) if node.layer.device else None
        if spec is not None and spec.task is not None:
            if spec.job not in (None, "worker"):
                raise InvalidArgumentError(f"layer {node.layer.name}: device {node.layer.device!r} names job "
                                           f"{spec.job!r}; pipeline stages run on the worker job")
            task = spec.task
        else:
            first = node.inputs[0]
            task = task_of.get(id(first), 0)
        task_of[id(node)] = task
        for parent in node.inputs:
            source = task_of.get(id(parent))
            if source is None or source == task or (source, task) in edges:
                continue
            if _reaches(edges, task, source):
                raise InvalidArgumentError(f"layer {node.layer.name} goes back to /job:worker/task:{task}: stage "
                                           f"{task} already feeds stage {source}, so the stages would form a cycle "
                                           "(a stage's layers must run before or after another's, not both)")
            edges[(source, task)] = node.layer.name
    for node in nodes:
        readers = [p.name for p in node.inputs if p.layer is None]
        if readers and task_of[id(node)] != 0:
            raise InvalidArgumentError(f"layer {node.layer.name} on /job:worker/task:{task_of[id(node)]} reads the "
                                       f"model's input {readers[0]!r}: only the input stage, task 0, reads inputs "
                                       f"(put {node.layer.name} on task 0, or a layer before it)")
    tasks = sorted(set(task_of.values()))
    if tasks != list(range(len(tasks))):
        raise InvalidArgumentError(f"pipeline stages run on worker tasks {tasks}: they must be 0, 1, ... "
                                   f"({len(tasks)} stages on tasks 0..{len(tasks) - 1})")
    output_task = task_of[id(network.output)]   # the one stage that sends nothing on: every layer leads to the output
    variables = {v.name: v for v in model.variables()}
    stages = []
    for task in tasks:
        mine = [n for n in nodes if task_of[id(n)] == task]
        receives, sends = {}, {}
        for node in nodes:
            for parent in node.inputs:
                source = task_of.get(id(parent))
                if source is None or source == task_of[id(node)]:
                    continue
                if task_of[id(node)] == task:
                    _add_once(receives.setdefault(source, []), parent)
                elif source == task:
                    _add_once(sends.setdefault(task_of[id(node)], []), parent)
        stage_variables = [variables[f"{n.layer.name}/{w.name}"] for n in mine for w in n.layer.weights]
        stages.append(Stage(model, task, mine, stage_variables, receives, sends,
                            network.output if task == output_task else None))
    for stage in stages:                    # gradients go up a tree: each stage to its first upstream stage
        stage.children = [s.index for s in stages if s.parent == stage.index]
    return stages


def start_order(links):
    """Stages of `links` ({stage: [the stages it sends to]}, as `stage_links` gives) with every stage after
    all the stages it sends to: the order to start them in, each listening before the stages that connect
    to it."""
    order = []
    while len(order) < len(links):
        ready = [k for k in sorted(links) if k not in order and all(d in order for d in links[k])]
        if not ready:
            raise InvalidArgumentError(f"the stages {sorted(set(links) - set(order))} send to each other in a cycle")
        order.append(ready[0])
    return order


def _reaches(edges, start, goal):
    """True when the stage graph `edges` has a path start -> ... -> goal."""
    frontier, seen = [start], {start}
    while frontier:
        here = frontier.pop()
        if here == goal:
            return True
        for a, b in edges:
            if a == here and b not in seen:
                seen.add(b)
                frontier.append(b)
    return False


def _add_once(nodes, node):
    if all(n is not node for n in nodes):
        nodes.append(node)


@dataclasses.dataclass
class Tape:
    """One micro-batch's forward pass through a stage, kept for its backward pass: `inputs` {tensor name:
    Tensor} received from upstream stages, `outputs` {tensor name: Tensor} this stage sends (the model's
    output on the output stage)."""

    inputs: dict
    outputs: dict
    params: dict
    updates: dict


class Stage:
    """The layers on worker task `index`; `receives` / `sends`: {stage: [Node]} the tensors it reads from
    upstream stages and those it sends downstream (tensors are named by the layer that made them)."""

    def __init__(self, model, index, nodes, variables, receives, sends, output=None):
        self.model, self.index, self.nodes, self.variables = model, index, nodes, variables
        self.layers = [n.layer for n in nodes]
        self.receives, self.sends, self.output = receives, sends, output
        self.upstream, self.downstream = sorted(receives), sorted(sends)
        self.parent = self.upstream[0] if self.upstream else None    # where its gradients go at a batch's end
        self.children = []
        self._own = {id(n) for n in nodes}

    @property
    def last(self):
        """True on the output stage (it computes the loss)."""
        return self.output is not None

    @property
    def variable_names(self):
        return [v.name for v in self.variables]

    def input_names(self, source):
        """Names of the tensors this stage reads from stage `source`, in the order they are sent."""
        return [n.layer.name for n in self.receives[source]]

    def output_names(self, target):
        """Names of the tensors this stage sends stage `target`, in order."""
        return [n.layer.name for n in self.sends[target]]

    def forward(self, params, inputs, seed=0, training=True):
        """({tensor name: array} of what this stage sends on (the output stage: {}), tape). `inputs`: the
        model's input on stage 0, else {tensor name: array} of what the upstream stages sent."""
        tensors = {v.name: (variable if v.trainable else constant)(self.model.param(params, v), v.name)
                   for v in self.variables}
        ctx = self.model.context(training=training, seed=seed)
        values, received = {}, {}
        if self.index == 0:
            given = self.model.input_tensor(inputs)
            for node in self.model.network.inputs:
                values[id(node)] = given[node.name] if isinstance(given, dict) else given
        else:
            for source in self.upstream:
                for node in self.receives[source]:
                    name = node.layer.name
                    if name not in inputs:
                        raise InvalidArgumentError(f"pipeline stage {self.index}: no tensor {name!r} from stage "
                                                   f"{source}")
                    value = np.asarray(inputs[name], self.model.dtype)
                    if value.shape[1:] != tuple(node.shape):
                        raise InvalidArgumentError(f"pipeline stage {self.index}: tensor {name!r} from stage "
                                                   f"{source} has per-example shape {list(value.shape[1:])}, layer "
                                                   f"{name} makes {list(node.shape)}")
                    values[id(node)] = received[name] = variable(value)
        for node in self.nodes:
            args = [values[id(p)] for p in node.inputs]
            values[id(node)] = node.layer.forward(tensors, args if len(args) > 1 else args[0], ctx)
        sent = {n.layer.name: values[id(n)] for target in self.downstream for n in self.sends[target]}
        if self.last:
            sent = {self.output.layer.name: values[id(self.output)]}
        tape = Tape(received, sent, tensors, ctx.updates)
        return ({} if self.last else {k: t.value for k, t in sent.items()}), tape

    def loss(self, tape, y, weight):
        """Output stage: the head's loss on the tape's output times `weight` (the micro-batch's share of the
        batch), and the backward pass from it: the micro-batches' losses and gradients add up to the batch's."""
        loss = self.model.head_loss(next(iter(tape.outputs.values())), y)
        loss.backward(np.asarray(weight, loss.value.dtype))
        return float(loss.value) * weight

    def backward(self, tape, grads):
        """Backward from {tensor name: d loss / d tensor} of the tensors this stage sent (each the sum over
        the stages it went to); call once per tape."""
        backward_all([(tape.outputs[name], np.asarray(g, tape.outputs[name].value.dtype))
                      for name, g in grads.items()])

    def gradients(self, tape):
        """({trainable variable: gradient}, {tensor name: d loss / d tensor} of the tensors received)
        after backward/loss."""
        grads = {v.name: (np.zeros(v.shape, self.model.dtype) if tape.params[v.name].grad is None
                          else tape.params[v.name].grad) for v in self.variables if v.trainable}
        upstream = {name: (np.zeros(t.value.shape, self.model.dtype) if t.grad is None else t.grad)
                    for name, t in tape.inputs.items()}
        return grads, upstream
