"""A checkpoint opened to run its model: the one place that turns a checkpoint into a model and its parameters.

`zmqflow evaluate`, `predict`, `export`, `serve --checkpoint` and the sweep's validation all open a
checkpoint the same way: the model is the `--model` given, else the spec the checkpoint records, else
the MNIST MLP (checkpoints from before the model was recorded); every variable the model declares is
read whatever the number of shards it was saved from, and checked against the model's shape.
"""

import dataclasses

from zmqflow.common.checkpoints.checkpoint import Checkpoint, find_checkpoint
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.registry import load_model
from zmqflow.models.spec import resolve_model


@dataclasses.dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint's model with its parameters: what a server loads and an evaluation runs."""

    path: str           # the ckpt-<step> directory
    step: int
    spec: dict          # the model spec it was rebuilt from
    data: dict | None   # the data spec and train-split statistics it records (trained with --data), else None
    model: object
    params: dict        # {variable name: value}

    @classmethod
    def open(cls, directory, model_spec=None, backend="numpy"):
        """The checkpoint `directory` names (a ckpt-<step>, or the latest one in it), its model rebuilt."""
        ckpt = Checkpoint(find_checkpoint(directory))
        spec = model_spec_of(ckpt, model_spec)
        model = load_model(spec, backend=backend)
        return cls(ckpt.path, ckpt.step, spec, recorded_data(ckpt), model, read_params(model, ckpt))


def model_spec_of(ckpt, model_spec=None):
    """The spec to rebuild `ckpt`'s model (a Checkpoint, or None when there is none yet): `model_spec`
    (a --model value) when given, else the one the checkpoint records, else the MNIST MLP."""
    recorded = ckpt.config.get("model") if ckpt is not None else None
    if model_spec is None and isinstance(recorded, dict):
        return recorded
    return resolve_model(model_spec)


def recorded_data(ckpt):
    """The data spec and statistics `ckpt` records (it was trained with --data), or None."""
    data = ckpt.config.get("data") if ckpt is not None else None
    return data if isinstance(data, dict) else None


def read_params(model, ckpt):
    """{variable: value} of `model`'s variables from `ckpt`; InvalidArgument naming a variable the
    checkpoint lacks or holds with another shape."""
    saved = {v.name: v for v in ckpt.variables()}
    params = {}
    for v in model.variables():
        if v.name not in saved:
            raise InvalidArgumentError(f"checkpoint {ckpt.path} has no variable {v.name!r}: was it saved from "
                                       f"another model? It holds {', '.join(sorted(saved)[:8])}")
        if tuple(saved[v.name].shape) != tuple(v.shape):
            raise InvalidArgumentError(f"variable {v.name!r} is {list(saved[v.name].shape)} in the checkpoint, the "
                                       f"model expects {list(v.shape)}")
        params[v.name] = ckpt.read(v.name)[0]
    return params
