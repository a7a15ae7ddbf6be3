"""Models from the user's own file: `--model path/to/model.py:build`.

The file is imported by path (each task imports it itself, so it must exist
where the task runs: a shared checkout, a mounted folder, an image built FROM
zmqflow's). `build(input_signature, **options)` returns a model of the protocol
(zmqflow.models.protocol); `input_signature` is {input name: (per-example shape,
dtype)} and the options are the spec's other fields (`--model-opt key=value`).
"""

import hashlib
import importlib.util
import inspect
import os
import sys

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.protocol import Model

DEFAULT_SIGNATURE = {"input": ((784,), "float32")}   # the MNIST rows the shipped data gives


def build_from_file(spec):
    """The model that `spec["type"]` (`path.py:function`) builds from the rest of the spec."""
    path, _, function = spec["type"].rpartition(":")
    builder = load_function(path, function)
    signature = _signature(spec.get("input_signature"))
    options = {k: v for k, v in spec.items() if k not in ("type", "input_signature")}
    try:
        inspect.signature(builder).bind(signature, **options)
    except TypeError as exc:
        raise InvalidArgumentError(f"{path}:{function} cannot be called as {function}(input_signature"
                                   f"{''.join(', ' + k + '=...' for k in options)}): {exc}") from None
    try:
        model = builder(signature, **options)
    except Exception as exc:
        raise InvalidArgumentError(f"{path}:{function} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, Model):
        raise InvalidArgumentError(f"{path}:{function} returned {type(model).__name__}, which lacks the model "
                                   "protocol's variables, initial_values, step and predict")
    return model


def load_function(path, function, what="model file"):
    """The function `function` of the Python file at `path`, imported once per process by path;
    errors name `what` the file is (a model file, a combine function's file)."""
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise InvalidArgumentError(f"{what} {path!r} does not exist (looked for {full})")
    name = "zmqflow_user_model_" + hashlib.sha1(full.encode()).hexdigest()[:12]
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, full)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise InvalidArgumentError(f"{what} {path!r} failed to import: {type(exc).__name__}: {exc}") from exc
        sys.modules[name] = module
    builder = getattr(module, function, None)
    if not callable(builder):
        raise InvalidArgumentError(f"{what} {path!r} has no function {function!r}")
    return builder


def file_sha256(path):
    """The sha256 (hex) of the file at `path` (resolved as load_function resolves it), or None when
    it cannot be read."""
    try:
        with open(os.path.abspath(os.path.expanduser(path)), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def _signature(raw):
    if raw is None:
        return dict(DEFAULT_SIGNATURE)
    try:
        return {str(name): (tuple(int(n) for n in shape), str(dtype)) for name, (shape, dtype) in raw.items()}
    except (AttributeError, TypeError, ValueError):
        raise InvalidArgumentError("model spec field 'input_signature' must map input names to [shape, dtype], "
                                   f"got {raw!r}") from None
