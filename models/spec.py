"""Model specs: the one small description of a model that ps, worker and aggregator share.

A spec is a dict (read from JSON or YAML). Every task validates the same spec and
derives the same ordered variable list and the same initial values from its seed, so
no task has to ship the initial model to another.

The built-in model is a multilayer perceptron with softmax cross-entropy loss:

    {"type": "mlp", "layers": [784, 100, 10], "activation": "sigmoid",
     "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1, "dtype": "float32"}

Its variables are `hidden/weights`, `hidden/biases` (or `hidden1/...`, `hidden2/...` when
there are several hidden layers) and `softmax/weights`, `softmax/biases`. Biases start
at zero, as in TensorFlow's dense layers. Labels are integer class ids and the loss is
the batch mean of the cross-entropy (`sparse_softmax_cross_entropy_with_logits`).

Any other model plugs in as `{"type": "package.module:ClassName", ...}`: the class is
called with the whole spec dict and must implement the `Model` protocol below.
"""

import os
import zlib
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np
import yaml

from zmqflow.common.variables import VariableSpec
from zmqflow.common.errors import InvalidArgumentError, NotFoundError

ACTIVATIONS = ("sigmoid", "relu", "tanh", "none")
INITIALIZERS = ("glorot_uniform", "truncated_normal", "zeros")
MODEL_DTYPES = ("float32", "float64")
LOSSES = ("softmax_cross_entropy",)
_MLP_KEYS = {"type", "layers", "activation", "init", "seed", "dtype", "loss"}


@runtime_checkable
class Model(Protocol):
    """What ps, worker and aggregator need from a model; params and grads are dicts by variable name.

    - `variables()`: the ordered variable list; its order is the order of placement.
    - `initial_values(seed)`: a fresh array per variable, the same on every task for a seed.
    - `loss_and_gradients(params, x, y)`: the mean loss of the batch (a float) and the
      gradient of that loss for every variable (same names, shapes and dtypes).
    - `predict(params, x)`: class probabilities, shape [batch, classes], as a numpy array.

    `x` is a float array [batch, inputs] and `y` integer class ids [batch]. A user class is
    constructed as `Class(spec)`. The built-in MLP's loss_and_gradients also takes
    `out={name: array}` to write the gradients into; callers must not rely on that for
    other models.
    """

    def variables(self) -> list[VariableSpec]: ...

    def initial_values(self, seed: int) -> dict[str, np.ndarray]: ...

    def loss_and_gradients(self, params: dict, x, y) -> tuple[float, dict]: ...

    def predict(self, params: dict, x) -> np.ndarray: ...


def read_spec(source):
    """A spec from a mapping, JSON/YAML text, or the path of a .json/.yaml file (not yet validated)."""
    if isinstance(source, Mapping):
        return dict(source)
    text = source  # JSON is YAML, so one parser reads both
    if isinstance(source, os.PathLike) or (isinstance(source, str) and source.endswith((".json", ".yaml", ".yml"))):
        if not os.path.isfile(source):
            raise NotFoundError(f"model spec file {os.fspath(source)!r} does not exist")
        with open(source, encoding="utf-8") as f:
            text = f.read()
    try:
        spec = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidArgumentError(f"model spec is not valid JSON or YAML: {exc}") from exc
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(f"model spec must be a mapping, got {type(spec).__name__}")
    return dict(spec)


def validate_spec(spec):
    """A normalized copy of an MLP spec (defaults filled in); InvalidArgumentError names a bad field.

    User model specs (`module:Class`) are only checked for their `type`; the class checks the rest.
    """
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(f"model spec must be a mapping, got {type(spec).__name__}")
    kind = spec.get("type")
    if not isinstance(kind, str) or not kind:
        raise InvalidArgumentError("model spec field 'type' is required: 'mlp' or 'module:Class'")
    if kind != "mlp":
        if ":" not in kind:
            raise InvalidArgumentError(f"model spec field 'type' {kind!r} is neither 'mlp' nor 'module:Class'")
        return dict(spec)
    unknown = sorted(set(spec) - _MLP_KEYS)
    if unknown:
        raise InvalidArgumentError(
            f"model spec field {unknown[0]!r} is not known; known: {', '.join(sorted(_MLP_KEYS))}")
    return {
        "type": "mlp",
        "layers": _check_layers(spec.get("layers")),
        "activation": _check_choice("activation", spec.get("activation", "sigmoid"), ACTIVATIONS),
        "init": _check_init(spec.get("init", "glorot_uniform")),
        "seed": _check_seed(spec.get("seed", 0)),
        "dtype": _check_choice("dtype", spec.get("dtype", "float32"), MODEL_DTYPES),
        "loss": _check_choice("loss", spec.get("loss", "softmax_cross_entropy"), LOSSES),
    }


def _check_layers(layers):
    if (not isinstance(layers, (list, tuple)) or len(layers) < 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in layers)):
        raise InvalidArgumentError(
            "model spec field 'layers' must list at least 2 positive integer widths (inputs ... classes), "
            f"got {layers!r}")
    if layers[-1] < 2:
        raise InvalidArgumentError(f"model spec field 'layers' must end with at least 2 classes, got {layers[-1]}")
    return [int(n) for n in layers]


def _check_choice(field, value, choices):
    if value not in choices:
        raise InvalidArgumentError(f"model spec field {field!r} is {value!r}; expected one of {', '.join(choices)}")
    return value


def _check_seed(seed):
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InvalidArgumentError(f"model spec field 'seed' must be a non-negative integer, got {seed!r}")
    return seed


def _check_init(init):
    """'glorot_uniform' or {"kind": ..., "stddev": ...} -> {"kind": ..., ["stddev": float]}."""
    if isinstance(init, str):
        init = {"kind": init}
    if not isinstance(init, Mapping):
        raise InvalidArgumentError(f"model spec field 'init' must be a name or a mapping, got {init!r}")
    kind = _check_choice("init.kind", init.get("kind"), INITIALIZERS)
    allowed = {"kind", "stddev"} if kind == "truncated_normal" else {"kind"}
    extra = sorted(set(init) - allowed)
    if extra:
        raise InvalidArgumentError(f"model spec field 'init.{extra[0]}' does not apply to init kind {kind!r}")
    if kind != "truncated_normal":
        return {"kind": kind}
    stddev = init.get("stddev", 1.0)
    if not isinstance(stddev, (int, float)) or isinstance(stddev, bool) or not stddev > 0:
        raise InvalidArgumentError(f"model spec field 'init.stddev' must be a positive number, got {stddev!r}")
    return {"kind": kind, "stddev": float(stddev)}


def layer_names(n_layers):
    """Scope names of the dense layers: ['softmax'], ['hidden', 'softmax'] or ['hidden1', 'hidden2', 'softmax']."""
    hidden = n_layers - 1
    if hidden == 1:
        return ["hidden", "softmax"]
    return [f"hidden{i + 1}" for i in range(hidden)] + ["softmax"]


def mlp_variables(spec):
    """The ordered (weights, biases) variables of each dense layer of a validated MLP spec."""
    sizes, dtype = spec["layers"], spec["dtype"]
    out = []
    for name, n_in, n_out in zip(layer_names(len(sizes) - 1), sizes[:-1], sizes[1:]):
        out.append(VariableSpec(f"{name}/weights", (n_in, n_out), dtype))
        out.append(VariableSpec(f"{name}/biases", (n_out,), dtype))
    return out


def mlp_initial_values(spec, seed=None):
    """Deterministic initial values of an MLP: each variable draws from its own stream, keyed by
    (seed, crc32(name)), so the values do not depend on the order or on which task asks."""
    seed = spec["seed"] if seed is None else _check_seed(seed)
    values = {}
    for var in mlp_variables(spec):
        if var.name.endswith("/biases"):
            values[var.name] = np.zeros(var.shape, dtype=var.dtype)
            continue
        rng = np.random.default_rng([seed, zlib.crc32(var.name.encode())])
        values[var.name] = initial_value(spec["init"], var.shape, rng).astype(var.dtype)
    return values


def initial_value(init, shape, rng):
    """One weight matrix drawn as TensorFlow's initializer of that name draws it (float64)."""
    kind = init["kind"]
    if kind == "zeros":
        return np.zeros(shape)
    if kind == "glorot_uniform":
        fan_in, fan_out = shape[0], shape[-1]
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-limit, limit, size=shape)
    # truncated_normal: values beyond two standard deviations are drawn again, as in TF.
    stddev = init["stddev"]
    values = rng.standard_normal(size=shape)
    bad = np.abs(values) > 2.0
    while bad.any():
        values[bad] = rng.standard_normal(size=int(bad.sum()))
        bad = np.abs(values) > 2.0
    return values * stddev


MNIST_MLP = {"type": "mlp", "layers": [784, 100, 10], "activation": "sigmoid",
             "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1}
"""The seeds' distributed MNIST network: 784-100-10 with a sigmoid hidden layer."""


def resolve_model(model_spec):
    """The spec of a `--model` option: the MNIST MLP when it is not given, else read_spec's."""
    return MNIST_MLP if model_spec is None else read_spec(model_spec)
