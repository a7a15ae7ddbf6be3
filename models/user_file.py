"""Models from the user's own code: `--model path/to/model.py:build` or `--model my_module:build`.

A file is imported by path, a module from the current directory or PYTHONPATH (each task imports
it itself, so it must exist where the task runs: a shared checkout, a mounted folder, an image
built FROM zmqflow's). `build(input_signature, **options)` returns a model of the protocol
(zmqflow.models.protocol); `input_signature` is {input name: (per-example shape, dtype)} and the
options are the spec's other fields (`--model-opt key=value`). A build that declares `outputs`
(the width the data's label asks for: its classes, label columns, or 1 for a regression) or `task`
(multiclass, binary, multi_label, regression) gets them too; one that does not is called as before.
Code runs only where the operator names it (docs/security.md; models/saved.py).
"""

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.protocol import Model

DEFAULT_SIGNATURE = {"input": ((784,), "float32")}   # the MNIST rows the shipped data gives
DEFAULT_TASK = {"outputs": 10, "task": "multiclass"}  # ... and their ten digits
TASK_FIELDS = tuple(DEFAULT_TASK)
_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def build_from_file(spec):
    """The model that `spec["type"]` (`path.py:function`) builds from the rest of the spec."""
    path, _, function = spec["type"].rpartition(":")
    return build_with(load_function(path, function), spec)


def build_with(builder, spec):
    """The model `builder` (a function of a model file or module) builds from `spec`: the input
    signature, `outputs` and `task` where it declares them, the other fields as options."""
    where = spec["type"]
    signature = _signature(spec.get("input_signature"))
    declared = inspect.signature(builder).parameters
    task = {k: spec.get(k, DEFAULT_TASK[k]) for k in TASK_FIELDS
            if k in declared and declared[k].kind in _NAMED}
    options = {k: v for k, v in spec.items() if k not in ("type", "input_signature", *TASK_FIELDS)}
    function = where.rpartition(":")[2]
    try:
        inspect.signature(builder).bind(signature, **task, **options)
    except TypeError as exc:
        raise InvalidArgumentError(f"{where} cannot be called as {function}(input_signature"
                                   f"{''.join(', ' + k + '=...' for k in [*task, *options])}): {exc}") from None
    try:
        model = builder(signature, **task, **options)
    except Exception as exc:
        raise InvalidArgumentError(f"{where} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, Model):
        raise InvalidArgumentError(f"{where} returned {type(model).__name__}, which lacks the model "
                                   "protocol's variables, initial_values, step and predict")
    return model


def load_module_attribute(kind):
    """The attribute `kind` (`module:name`) names, its module imported from PYTHONPATH or the current
    directory (a console script's path lacks it; `python -m` has it)."""
    module_name, _, name = kind.partition(":")
    here = os.getcwd()
    if not any(os.path.abspath(p or ".") == here for p in sys.path):
        sys.path.append(here)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise InvalidArgumentError(f"model {kind!r}: module {module_name!r} cannot be imported (looked on "
                                   f"PYTHONPATH and in the current directory {here}): {type(exc).__name__}: "
                                   f"{exc}") from exc
    if not hasattr(module, name):
        raise InvalidArgumentError(f"model {kind!r}: module {module_name!r} ({getattr(module, '__file__', '?')}) "
                                   f"has no {name!r}")
    return getattr(module, name)


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
