"""Model specs: the one small description of a model that ps, worker and aggregator share.

A spec is a dict (read from JSON or YAML). Every task validates the same spec and
derives the same ordered variable list and the same initial values from its seed, so
no task has to ship the initial model to another.

The built-in MLP (models/builtin.py builds it from Dense layers) has softmax cross-entropy loss:

    {"type": "mlp", "layers": [784, 100, 10], "activation": "sigmoid",
     "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1, "dtype": "float32"}

Its variables are `hidden/weights`, `hidden/biases` (or `hidden1/...`, `hidden2/...` when
there are several hidden layers) and `softmax/weights`, `softmax/biases`. Biases start
at zero, as in TensorFlow's dense layers. Labels are integer class ids and the loss is
the batch mean of the cross-entropy (`sparse_softmax_cross_entropy_with_logits`).

Other models: the built-ins by name (`{"type": "cnn"}`, models/builtin.py), a function in
the user's file (`{"type": "path/model.py:build", ...options}`, models/user_file.py), or
`{"type": "package.module:ClassName", ...}`, a class called with the whole spec dict. Each
implements the model protocol (zmqflow.models.protocol).
"""

import os
import zlib
from collections.abc import Mapping

import numpy as np

from zmqflow.common.errors import InvalidArgumentError, check_int
from zmqflow.common.spec_files import parse_yaml, read_spec_file
from zmqflow.models import protocol as _protocol

BUILTIN_TYPES = ("mlp", "cnn", "logistic", "linear")   # models/builtin.py builds them
ACTIVATIONS = ("sigmoid", "relu", "tanh", "none")
INITIALIZERS = ("glorot_uniform", "truncated_normal", "zeros")
MODEL_DTYPES = ("float32", "float64")
LOSSES = ("softmax_cross_entropy",)
_MLP_KEYS = {"type", "layers", "activation", "init", "seed", "dtype", "loss"}


# The protocol lives in zmqflow.models.protocol; kept importable from here.
Model = _protocol.Model


def read_spec(source):
    """A spec from a mapping, a built-in model's name (`cnn`), a model file (`path/model.py:build`),
    JSON/YAML text, or the path of a .json/.yaml file (not yet validated)."""
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, str) and source.strip() == "mlp":
        return dict(MNIST_MLP)          # the MNIST MLP 784-100-10; --model-opt layers=... reshapes it
    if isinstance(source, str) and source.strip() in BUILTIN_TYPES:
        return {"type": source.strip()}
    if isinstance(source, str) and is_model_file(source.strip()):
        return {"type": source.strip()}
    if isinstance(source, os.PathLike) or (isinstance(source, str) and source.endswith((".json", ".yaml", ".yml"))):
        spec = read_spec_file(source, "model spec file")
    else:
        spec = parse_yaml(source, "model spec")      # JSON text is YAML 1.2, so one parser reads both
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(f"model spec must be a mapping, got {type(spec).__name__}")
    return dict(spec)


def is_model_file(kind):
    """Whether a spec type names a function in a Python file: `path/to/model.py:build`."""
    path, sep, function = kind.rpartition(":")
    return bool(sep) and path.endswith(".py") and function.isidentifier()


def with_options(spec, options):
    """`spec` with `key=value` options (`--model-opt`) set; values are read as YAML (8, [8, 16], relu)."""
    spec = dict(spec)
    for option in options:
        key, sep, text = option.partition("=")
        if not sep or not key.strip():
            raise InvalidArgumentError(f"model option {option!r} is not key=value")
        spec[key.strip()] = parse_yaml(text, f"model option {option!r}: the value")
    return spec


def validate_spec(spec):
    """A normalized copy of an MLP spec (defaults filled in); InvalidArgumentError names a bad field.

    User model specs (`module:Class`) are only checked for their `type`; the class checks the rest.
    """
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(f"model spec must be a mapping, got {type(spec).__name__}")
    kind = spec.get("type")
    if not isinstance(kind, str) or not kind:
        raise InvalidArgumentError(f"model spec field 'type' is required: one of {', '.join(BUILTIN_TYPES)} "
                                   "or 'module:Class'")
    if kind != "mlp":
        if ":" not in kind and kind not in BUILTIN_TYPES:
            raise InvalidArgumentError(f"model spec field 'type' {kind!r} is neither a built-in model "
                                       f"({', '.join(BUILTIN_TYPES)}) nor 'module:Class'")
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
        "seed": check_int("model spec field 'seed'", spec.get("seed", 0)),
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


def variable_rng(seed, name):
    """Each variable draws from its own stream, keyed by (seed, crc32(name)): the values depend
    neither on the order of the variables nor on which task asks."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


MNIST_MLP = {"type": "mlp", "layers": [784, 100, 10], "activation": "sigmoid",
             "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1}
"""The seeds' distributed MNIST network: 784-100-10 with a sigmoid hidden layer."""


def resolve_model(model_spec):
    """The spec of a `--model` option: the MNIST MLP when it is not given, else read_spec's."""
    return MNIST_MLP if model_spec is None else read_spec(model_spec)
