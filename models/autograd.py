"""Reverse-mode automatic differentiation over arrays, micrograd-style.

A `Tensor` holds a value (a numpy or CuPy array), the tensors it was computed
from, and a `backward(g)` closure that, given the gradient of the loss with
respect to this tensor, adds each parent's share into `parent.grad`. Ops
(zmqflow.models.ops, zmqflow.models.conv_ops) build that closure next to
their forward computation, so each op's two halves are read together.

`loss.backward()` visits the graph once in reverse topological order: a tensor
is made after the tensors it is computed from, so the reverse of the order of
making is one. Only tensors that need a gradient (variables, and what was
computed from them) get one; inputs and labels are constants.
"""

import itertools

import numpy as np

_made = itertools.count()    # the order tensors are made in


class Tensor:
    """A node of the graph. `value`: the array; `grad`: d loss / d value after backward() (or None)."""

    __slots__ = ("value", "grad", "parents", "backward_fn", "requires_grad", "name", "order")

    def __init__(self, value, parents=(), backward_fn=None, requires_grad=None, name=None):
        self.value = value
        self.grad = None
        self.parents = parents
        self.backward_fn = backward_fn
        if requires_grad is None:       # a loop, not any(): this runs for every op of every step
            requires_grad = False
            for parent in parents:
                if parent.requires_grad:
                    requires_grad = True
                    break
        self.requires_grad = requires_grad
        self.name = name
        self.order = next(_made)

    @property
    def shape(self):
        return self.value.shape

    @property
    def dtype(self):
        return self.value.dtype

    def __repr__(self):
        label = f" {self.name!r}" if self.name else ""
        return f"Tensor{label}(shape={tuple(self.shape)}, dtype={self.dtype})"

    def accumulate(self, g):
        """Add `g` to this tensor's gradient (a no-op for constants)."""
        if not self.requires_grad:
            return
        self.grad = g if self.grad is None else self.grad + g

    def backward(self, grad=None):
        """Propagate d self / d x to every tensor `self` depends on. `self` is usually a scalar loss."""
        if grad is None:
            value = self.value
            grad = np.ones(value.shape, value.dtype) if value.shape else np.array(1, value.dtype)   # np.ones is slow
        self.grad = grad
        if self.requires_grad and self.backward_fn is not None:
            _propagate([self])


def backward_all(roots):
    """Backward from several tensors at once, `roots` [(tensor, d loss / d tensor)]: as if from one loss
    that reads them all, so a tensor reached from several roots (or itself a root that feeds another)
    gets the sum of their gradients. A pipeline stage whose outputs go to several stages runs this."""
    start = []
    for tensor, grad in roots:
        if tensor.requires_grad:
            tensor.grad = grad if tensor.grad is None else tensor.grad + grad
            if tensor.backward_fn is not None:
                start.append(tensor)
    _propagate(start)


def _propagate(roots):
    """Run the backward closures of every op the roots depend on, latest made first (their grads set)."""
    found, stack = {}, list(roots)
    while stack:                       # no recursion: deep networks do not hit the recursion limit
        node = stack.pop()
        if node.order not in found:
            found[node.order] = node
            for parent in node.parents:   # only ops are visited: variables just collect their gradient
                if parent.backward_fn is not None and parent.requires_grad:
                    stack.append(parent)
    for key in sorted(found, reverse=True):
        node = found[key]
        if node.grad is not None:
            node.backward_fn(node.grad)


def constant(value, name=None):
    """A tensor that needs no gradient (inputs, labels, masks)."""
    return value if isinstance(value, Tensor) else Tensor(value, requires_grad=False, name=name)


def variable(value, name=None):
    """A leaf that collects a gradient (a model parameter)."""
    return Tensor(value, requires_grad=True, name=name)


def unbroadcast(g, shape):
    """`g` summed down to `shape`: the gradient of a broadcast operand (a bias added to every row)."""
    if g.shape == tuple(shape):
        return g
    extra = g.ndim - len(shape)
    if extra:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g
