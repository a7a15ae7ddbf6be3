"""Model specs: the one small description of a model that ps, worker and aggregator share.

A spec is a dict (read from JSON or YAML). Every task validates the same spec and
derives the same ordered variable list and the same initial values from its seed, so
no task has to ship the initial model to another.

The built-in MLP (models/builtin.py builds it from Dense layers) has softmax cross-entropy loss
by default (`loss: mse` or `huber` makes it a regressor, `sigmoid_cross_entropy` a multi-label one):

    {"type": "mlp", "layers": [784, 100, 10], "activation": "sigmoid",
     "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1, "dtype": "float32"}

Its variables are `hidden/weights`, `hidden/biases` (or `hidden1/...`, `hidden2/...` when
there are several hidden layers) and `softmax/weights`, `softmax/biases`. Biases start
at zero, as in TensorFlow's dense layers. Labels are integer class ids and the loss is
the batch mean of the cross-entropy (`sparse_softmax_cross_entropy_with_logits`). A regressor's
output layer is `output` (`output/weights`, `output/biases`).

Other models: the built-ins by name (`{"type": "cnn"}`, models/builtin.py), a function in
the user's file (`{"type": "path/model.py:build", ...options}`) or module (`{"type":
"my_module:build"}`, imported from the current directory or PYTHONPATH; models/user_file.py), or
`{"type": "package.module:ClassName", ...}`, a class called with the whole spec dict. Each
implements the model protocol (zmqflow.models.protocol).

A spec fitted to data (inputs/data_spec.py's model_for_data) may also hold what the train split
gives the model's head, HEAD_FIELDS: `output_bias` (the output layer's first bias) and
`target_scale` ({mean, std} of a regression's target); models/registry.py applies them.
"""

import difflib

import os
import re
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
LOSSES = ("softmax_cross_entropy", "sigmoid_cross_entropy", "mse", "huber")   # layer_model.HEADS
REGRESSION_LOSSES = ("mse", "huber")
HEAD_FIELDS = ("output_bias", "target_scale")   # from the train split; models/registry.py applies them
PIPELINE_FIELD = "pipeline"    # {layer name: worker task}: the model split over workers (models/stages.py split_at)
_MODULE_FUNCTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")   # my_module:build, pkg.mod:Cls
_MLP_KEYS = {"type", "layers", "activation", "init", "seed", "dtype", "loss"}


# The protocol lives in zmqflow.models.protocol; kept importable from here.
Model = _protocol.Model


def read_spec(source):
    """A spec from a mapping, a built-in model's name (`cnn`), a model file (`path/model.py:build`),
    a function or class in a module (`my_module:build`), JSON/YAML text, or the path of a .json/.yaml
    file (not yet validated). Anything else is InvalidArgument listing what a model can be, with a
    "did you mean" for a misspelt built-in."""
    if isinstance(source, Mapping):
        return dict(source)
    if isinstance(source, str) and source.strip() == "mlp":
        return dict(MNIST_MLP)          # the MNIST MLP 784-100-10; --model-opt layers=... reshapes it
    if isinstance(source, str) and source.strip() in BUILTIN_TYPES:
        return {"type": source.strip()}
    if isinstance(source, str) and (is_model_file(source.strip()) or _MODULE_FUNCTION.match(source.strip())):
        return {"type": source.strip()}
    if isinstance(source, os.PathLike) or (isinstance(source, str) and source.endswith((".json", ".yaml", ".yml"))):
        spec = read_spec_file(source, "model spec file")
    else:
        spec = parse_yaml(source, "model spec")      # JSON text is YAML 1.2, so one parser reads both
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(_not_a_model(source, spec))
    return dict(spec)


MODEL_FORMS = (f"a built-in model ({', '.join(BUILTIN_TYPES)}), a function in your file (path/model.py:build), "
               "a function in a module on PYTHONPATH or in the current directory (my_module:build), a spec file "
               "(.json, .yaml) or an inline spec ('{\"type\": \"mlp\", \"layers\": [784, 64, 10]}')")


def _not_a_model(source, parsed):
    """Why `source` (read as YAML: `parsed`) names no model, and what would."""
    text = os.fspath(source).strip() if isinstance(source, (str, os.PathLike)) else repr(source)
    if text.endswith(".py"):
        return f"model {text!r} names a file but not its function: give path/model.py:build"
    if isinstance(parsed, str) and ":" not in text:
        close = difflib.get_close_matches(text.lower(), BUILTIN_TYPES, n=1, cutoff=0.5)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"model {text!r} is not known: {hint}A model is {MODEL_FORMS}"
    return f"model {text!r} is not a model spec (it reads as a {type(parsed).__name__}): a model is {MODEL_FORMS}"


def is_model_file(kind):
    """Whether a spec type names a function in a Python file: `path/to/model.py:build`."""
    path, sep, function = kind.rpartition(":")
    return bool(sep) and path.endswith(".py") and function.isidentifier()


def split_head(spec):
    """(the spec without HEAD_FIELDS, {field: value} of those it has): what the model is, and what the
    train split gives its head."""
    return ({k: v for k, v in spec.items() if k not in HEAD_FIELDS},
            {k: spec[k] for k in HEAD_FIELDS if spec.get(k) is not None})


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
        raise InvalidArgumentError(_not_a_model(spec, spec))
    kind = spec.get("type")
    if not isinstance(kind, str) or not kind:
        raise InvalidArgumentError(f"model spec field 'type' is required: one of {', '.join(BUILTIN_TYPES)} "
                                   "or 'module:Class'")
    if kind != "mlp":
        if ":" not in kind and kind not in BUILTIN_TYPES:
            close = difflib.get_close_matches(kind.lower(), BUILTIN_TYPES, n=1, cutoff=0.5)
            raise InvalidArgumentError(f"model spec field 'type' {kind!r} is not known: "
                                       f"{f'did you mean {close[0]!r}? ' if close else ''}A model is {MODEL_FORMS}")
        return dict(spec)
    unknown = sorted(set(spec) - _MLP_KEYS)
    if unknown:
        raise InvalidArgumentError(
            f"model spec field {unknown[0]!r} is not known; known: {', '.join(sorted(_MLP_KEYS))}")
    loss = _check_choice("loss", spec.get("loss", "softmax_cross_entropy"), LOSSES)
    return {
        "type": "mlp",
        "layers": _check_layers(spec.get("layers"), loss),
        "activation": _check_choice("activation", spec.get("activation", "sigmoid"), ACTIVATIONS),
        "init": _check_init(spec.get("init", "glorot_uniform")),
        "seed": check_int("model spec field 'seed'", spec.get("seed", 0)),
        "dtype": _check_choice("dtype", spec.get("dtype", "float32"), MODEL_DTYPES),
        "loss": loss,
    }


def _check_layers(layers, loss="softmax_cross_entropy"):
    if (not isinstance(layers, (list, tuple)) or len(layers) < 2
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in layers)):
        raise InvalidArgumentError(
            "model spec field 'layers' must list at least 2 positive integer widths (inputs ... outputs), "
            f"got {layers!r}")
    if loss == "softmax_cross_entropy" and layers[-1] < 2:
        raise InvalidArgumentError(f"model spec field 'layers' must end with at least 2 classes, got {layers[-1]} "
                                   "(a regression: loss mse)")
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


def layer_names(n_layers, output="softmax"):
    """Scope names of the dense layers: ['softmax'], ['hidden', 'softmax'] or ['hidden1', 'hidden2', 'softmax']
    (`output` names the last: a regressor's is 'output')."""
    hidden = n_layers - 1
    if hidden == 1:
        return ["hidden", output]
    return [f"hidden{i + 1}" for i in range(hidden)] + [output]


def variable_rng(seed, name):
    """Each variable draws from its own stream, keyed by (seed, crc32(name)): the values depend
    neither on the order of the variables nor on which task asks."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


MNIST_MLP = {"type": "mlp", "layers": [784, 100, 10], "activation": "sigmoid",
             "init": {"kind": "truncated_normal", "stddev": 0.1}, "seed": 1}
"""The seeds' distributed MNIST network: 784-100-10 with a sigmoid hidden layer."""

DATA_MLP = {**MNIST_MLP, "activation": "relu", "init": "glorot_uniform"}
"""`mlp` (and no --model) fitted to a data spec other than the MNIST sample: the MNIST MLP's 100 hidden units
with Keras' Dense defaults, relu and glorot_uniform weights (biases start at zero). The seeds' sigmoid and
truncated normal (stddev 0.1) leave an MLP on a few standardised columns nearly linear and slow: on the
300-row examples/data/flowers.csv, 20 epochs (42 steps) of it scored 0.28-0.62 test accuracy, this 1.0."""


def resolve_model(model_spec, data_mlp=False):
    """The spec of a `--model` option: read_spec's, and the MNIST MLP when it is not given. `data_mlp`: the
    model is fitted to a data spec other than the MNIST sample, where `mlp` and no model are DATA_MLP."""
    if model_spec is None or (isinstance(model_spec, str) and model_spec.strip() == "mlp"):
        return dict(DATA_MLP if data_mlp else MNIST_MLP)
    return read_spec(model_spec)
