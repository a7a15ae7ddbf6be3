"""The model registry: a spec's `type` -> the model object (a built-in of models/builtin.py, a function
in a model file or module, or `module:Class(spec)`), its head fitted to what the train split gave
(models/spec.py's HEAD_FIELDS)."""

import inspect
from collections.abc import Mapping

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.builtin import BUILDERS, build
from zmqflow.models.spec import PIPELINE_FIELD, REGRESSION_LOSSES, Model, is_model_file, split_head, validate_spec
from zmqflow.models.stages import split_at
from zmqflow.models.user_file import build_from_file, build_with, load_module_attribute


def load_model(spec, backend="numpy"):
    """The model object for a spec: a built-in on the ops backend `backend`, a function of a file
    (`path/model.py:build`) or module (`my_module:build`), or a class called with the spec
    (`module:Class`); with `output_bias` and `target_scale` applied where the model takes them, and split
    over workers by its `pipeline` field ({layer name: worker task}, models/stages.py's `split_at`)."""
    spec, head = split_head(spec) if isinstance(spec, Mapping) else (spec, {})
    stages = spec.pop(PIPELINE_FIELD, None) if isinstance(spec, Mapping) else None
    return split_at(fit_head(_build(validate_spec(spec), backend, head), head), stages)


def _build(spec, backend, head):
    if spec["type"] in BUILDERS:
        return build(spec, backend)
    if is_model_file(spec["type"]):
        return build_from_file(spec)
    found = load_module_attribute(spec["type"])
    if not inspect.isclass(found):
        if not callable(found):
            raise InvalidArgumentError(f"model {spec['type']!r} is a {type(found).__name__}, not a function "
                                       "build(input_signature, **options) or a model class")
        return build_with(found, spec)
    model = found({**spec, **head})     # a class gets the whole spec
    if not isinstance(model, Model):
        raise InvalidArgumentError(
            f"model class {spec['type']!r} does not implement variables, initial_values, step and predict")
    return model


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
