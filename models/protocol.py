"""The model protocol: what every part of zmqflow needs from a model, and nothing more.

A model

- declares its variables: `variables()` -> [VariableSpec(name, shape, dtype,
  trainable, initializer, device)], in placement order;
- draws their first values: `initial_values(seed)` -> {name: array}, the same on
  every task for a seed;
- states its input signature: `input_signature()` -> {input name: (per-example
  shape, dtype)}, e.g. {"input": ((784,), "float32")};
- trains: `step(params, batch)` -> (loss, grads, metrics), where batch is (x, y),
  grads has the trainable variables' gradients and metrics a dict of floats;
  new values of non-trainable variables (BatchNorm's moving statistics) come
  in metrics["updates"];
- predicts: `predict(params, x)` -> outputs [batch, ...] (class probabilities
  for classifiers).

`params` are {variable name: array}. `x` is an array for a model of one input,
else {input name: array}.
"""

from typing import Protocol, runtime_checkable

import numpy as np

from zmqflow.common.errors import InvalidArgumentError


@runtime_checkable
class Model(Protocol):
    """The four methods every model has (see the module docstring; input_signature is optional)."""

    def variables(self) -> list: ...

    def initial_values(self, seed: int) -> dict: ...

    def step(self, params: dict, batch) -> tuple: ...

    def predict(self, params: dict, x) -> np.ndarray: ...


def checked_param(params, var):
    """params[var.name], or InvalidArgument naming the missing or mis-shaped parameter."""
    value = params.get(var.name) if hasattr(params, "get") else None
    if value is None:
        raise InvalidArgumentError(f"parameter {var.name!r} is missing")
    if tuple(value.shape) != tuple(var.shape):
        raise InvalidArgumentError(f"parameter {var.name!r} has shape {list(value.shape)}, expected {list(var.shape)}")
    return value


def input_signature(model):
    """{input name: (per-example shape, dtype)}; for a model without the method, the first
    variable's first dimension (the width of a dense first layer, as the built-in MLP has)."""
    method = getattr(model, "input_signature", None)
    if method is not None:
        return {name: (tuple(shape), str(dtype)) for name, (shape, dtype) in method().items()}
    first = model.variables()[0]
    return {"input": ((int(first.shape[0]),), str(first.dtype))}


def zero_inputs(model, rows):
    """A batch of `rows` zeros in the model's input signature (to compile kernels before serving)."""
    signature = input_signature(model)
    arrays = {name: np.zeros((rows,) + shape, dtype=dtype) for name, (shape, dtype) in signature.items()}
    return next(iter(arrays.values())) if len(arrays) == 1 else arrays


def zero_labels(model, rows):
    """Labels of zeros for `rows` examples in the shape the model's loss takes (class ids by default;
    a model may say otherwise with its own `zero_labels`): to compile kernels before training."""
    method = getattr(model, "zero_labels", None)
    return method(rows) if method is not None else np.zeros(rows, dtype=np.int32)


def output_width(model):
    """The width of the model's output (classes for a classifier)."""
    method = getattr(model, "output_shape", None)
    if method is not None:
        return int(np.prod(method()))
    return int(model.variables()[-1].shape[-1])


def every_gradient(model, grads):
    """`grads` with zeros for the variables it lacks (the non-trainable ones): the ps takes a
    gradient for every variable it holds, and a zero never moves a variable."""
    missing = [v for v in model.variables() if v.name not in grads]
    if not missing:
        return grads
    return {**grads, **{v.name: np.zeros(v.shape, v.dtype) for v in missing}}
