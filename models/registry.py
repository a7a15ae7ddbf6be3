"""The model registry: a spec's `type` -> the model object (a built-in of models/builtin.py, a function
in a model file, or `module:Class(spec)`)."""

import importlib

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.builtin import BUILDERS, build
from zmqflow.models.spec import Model, is_model_file, validate_spec
from zmqflow.models.user_file import build_from_file


def load_model(spec, backend="numpy"):
    """The model object for a spec: a built-in on the ops backend `backend`, or `module:Class(spec)`."""
    spec = validate_spec(spec)
    if spec["type"] in BUILDERS:
        return build(spec, backend)
    if is_model_file(spec["type"]):
        return build_from_file(spec)
    module_name, _, class_name = spec["type"].partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgumentError(f"model spec field 'type' {spec['type']!r} cannot be loaded: {exc}") from exc
    model = cls(spec)
    if not isinstance(model, Model):
        raise InvalidArgumentError(
            f"model class {spec['type']!r} does not implement variables, initial_values, step and predict")
    return model


def model_variables(spec):
    """The variable list of any model spec (built-in or `module:Class`)."""
    return load_model(spec).variables()
