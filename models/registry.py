"""The model registry: a spec's `type` -> the model object (a built-in of models/builtin.py, a function
in a model file or module, or `module:Class(spec)`), its head fitted to what the train split gave
(models/spec.py's HEAD_FIELDS)."""

import inspect
from collections.abc import Mapping

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.builtin import BUILDERS, build
from zmqflow.models.spec import REGRESSION_LOSSES, Model, is_model_file, split_head, validate_spec
from zmqflow.models.user_file import build_from_file, build_with, load_module_attribute


def load_model(spec, backend="numpy"):
    """The model object for a spec: a built-in on the ops backend `backend`, a function of a file
    (`path/model.py:build`) or module (`my_module:build`), or a class called with the spec
    (`module:Class`); with `output_bias` and `target_scale` applied where the model takes them."""
    spec, head = split_head(spec) if isinstance(spec, Mapping) else (spec, {})
    spec = validate_spec(spec)
    if spec["type"] in BUILDERS:
        return fit_head(build(spec, backend), head)
    if is_model_file(spec["type"]):
        return fit_head(build_from_file(spec), head)
    found = load_module_attribute(spec["type"])
    if not inspect.isclass(found):
        if not callable(found):
            raise InvalidArgumentError(f"model {spec['type']!r} is a {type(found).__name__}, not a function "
                                       "build(input_signature, **options) or a model class")
        return fit_head(build_with(found, spec), head)
    model = found({**spec, **head})     # a class gets the whole spec
    if not isinstance(model, Model):
        raise InvalidArgumentError(
            f"model class {spec['type']!r} does not implement variables, initial_values, step and predict")
    return fit_head(model, head)


def fit_head(model, head):
    """`model` with the train split's statistics applied where it takes them (a LayerModel: the output
    bias's first value, a regression's standardised target); other models train as they are."""
    bias, scale = head.get("output_bias"), head.get("target_scale")
    if scale is not None and callable(getattr(model, "standardize_target", None)) \
            and getattr(model, "loss_name", None) in REGRESSION_LOSSES:
        if not (isinstance(scale, Mapping) and {"mean", "std"} <= set(scale)):
            raise InvalidArgumentError(f"model spec field 'target_scale' is {{mean: ..., std: ...}}, got {scale!r}")
        model.standardize_target(scale["mean"], scale["std"])
    if bias is not None and callable(getattr(model, "set_output_bias", None)):
        try:
            model.set_output_bias([float(b) for b in bias])
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"model spec field 'output_bias' lists one number per output, got "
                                       f"{bias!r}") from None
    return model


def model_variables(spec):
    """The variable list of any model spec (built-in or `module:Class`)."""
    return load_model(spec).variables()
