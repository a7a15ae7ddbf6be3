"""A PyTorch `nn.Module` on zmqflow's cluster.

    net = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = TorchModel(net, input_shape=(784,))              # device="cuda" to compute on a GPU

The module's named parameters become trainable variables on the ps (`0.weight` ->
`0/weight`), its floating-point buffers non-trainable ones (BatchNorm's running
mean and variance: the workers assign their new values after each step, as for
zmqflow's own BatchNorm). The worker loads the pulled values into the module,
runs PyTorch's forward and backward, and pushes the parameters' gradients;
serving runs the module in eval mode under `torch.inference_mode()`.
Integer buffers (BatchNorm's `num_batches_tracked`) stay local to each process.
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.common.variables import VariableSpec
from zmqflow.models.protocol import checked_param

LOSSES = ("softmax_cross_entropy", "sigmoid_cross_entropy", "mse")


def _torch():
    try:
        import torch
    except ImportError:
        raise InvalidArgumentError("the PyTorch adapter needs PyTorch: pip install 'zmqflow[torch]'") from None
    return torch


class TorchModel:
    """`module(x) -> outputs` (logits for the cross-entropy heads) as a zmqflow model."""

    framework, onnx_exporter = "PyTorch", "torch.onnx.export(model.module, ...)"   # zmqflow exports only its own layers

    def __init__(self, module, input_shape, loss="softmax_cross_entropy", device="cpu", seed=0):
        torch = _torch()
        if loss not in LOSSES and not callable(loss):
            raise InvalidArgumentError(f"loss {loss!r} is not one of {', '.join(LOSSES)} or a function")
        self.torch, self.module, self.loss = torch, module.to(device), loss
        self.device, self.seed = torch.device(device), seed
        self.input_shape = tuple(int(n) for n in input_shape)
        self._params = dict(module.named_parameters())
        self._buffers = {n: b for n, b in module.named_buffers() if b.is_floating_point()}
        self._initial = {n: t.detach().cpu().numpy().copy() for n, t in {**self._params, **self._buffers}.items()}
        self._variables = ([VariableSpec(_name(n), tuple(p.shape), _dtype(p), p.requires_grad)
                            for n, p in self._params.items()]
                           + [VariableSpec(_name(n), tuple(b.shape), _dtype(b), False) for n, b in self._buffers.items()])
        self._torch_names = {_name(n): n for n in {**self._params, **self._buffers}}

    # ------------------------------------------------ declarations

    def variables(self):
        return list(self._variables)

    def input_signature(self):
        return {"input": (self.input_shape, "float32")}

    def output_shape(self):
        """The shape of one row's output, from the module itself (one zero row in eval mode: its last
        variable may be a buffer, such as a BatchNorm's running statistics, not the output layer's)."""
        torch = self.torch
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.inference_mode():
                out = self.module(torch.zeros((1, *self.input_shape), device=self.device))
        finally:
            self.module.train(was_training)
        return tuple(out.shape[1:])

    def initial_values(self, seed=None):
        """The module's values when it was handed over (build it under torch.manual_seed(seed)
        for other draws)."""
        return {_name(n): v.copy() for n, v in self._initial.items()}

    # ------------------------------------------------ compute

    def step(self, params, batch):
        torch = self.torch
        x, y = batch
        self._load(params)
        self.module.train()
        self.module.zero_grad(set_to_none=True)
        outputs = self.module(torch.as_tensor(np.asarray(x, np.float32), device=self.device))
        loss = self._loss(outputs, y)
        loss.backward()
        grads = {}
        for name, p in self._params.items():
            if p.requires_grad:
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                grads[_name(name)] = g.detach().cpu().numpy()
        loss_value = loss.item()
        metrics = {"loss": loss_value}
        if self.loss == "softmax_cross_entropy":
            metrics["accuracy"] = float((outputs.argmax(dim=-1).cpu().numpy() == np.asarray(y)).mean())
        if self._buffers:
            metrics["updates"] = {_name(n): b.detach().cpu().numpy().copy() for n, b in self._buffers.items()}
        return loss_value, grads, metrics

    def predict(self, params, x):
        torch = self.torch
        self._load(params)
        self.module.eval()
        with torch.inference_mode():
            outputs = self.module(torch.as_tensor(np.asarray(x, np.float32), device=self.device))
            if self.loss == "softmax_cross_entropy":
                outputs = torch.softmax(outputs, dim=-1)
            elif self.loss == "sigmoid_cross_entropy":
                outputs = torch.sigmoid(outputs)
        return outputs.cpu().numpy()

    # ------------------------------------------------ helpers

    def _load(self, params):
        torch = self.torch
        with torch.no_grad():
            for var in self._variables:
                value = checked_param(params, var)
                name = self._torch_names[var.name]
                target = self._params.get(name, self._buffers.get(name))
                target.copy_(torch.as_tensor(np.asarray(value), device=self.device))

    def _loss(self, outputs, y):
        torch = self.torch
        functional = torch.nn.functional
        if callable(self.loss):
            return self.loss(outputs, y)
        target = torch.as_tensor(np.asarray(y), device=self.device)
        if self.loss == "softmax_cross_entropy":
            return functional.cross_entropy(outputs, target.long().reshape(-1))
        if self.loss == "sigmoid_cross_entropy":
            return functional.binary_cross_entropy_with_logits(outputs, target.float().reshape(outputs.shape))
        return functional.mse_loss(outputs, target.float().reshape(outputs.shape))


def _name(torch_name):
    """PyTorch's dotted names as zmqflow's slash-separated ones: `0.weight` -> `0/weight`."""
    return torch_name.replace(".", "/")


def _dtype(tensor):
    return str(tensor.dtype).replace("torch.", "")
