"""A checkpoint opened to run its model: the one place that turns a checkpoint into a model and its parameters.

`zmqflow evaluate`, `predict`, `export`, `serve --checkpoint` and the sweep's validation all open a
checkpoint the same way: the model is the `--model` given, else the spec the checkpoint records, else
the MNIST MLP (checkpoints from before the model was recorded); every variable the model declares is
read whatever the number of shards it was saved from, and checked against the model's shape.

A checkpoint is data (docs/security.md): the model it records is built only when it is a
built-in one. Code it names (`module:Class`, `path/model.py:build`) runs only when the operator gives
that model (`--model`, `model_spec=`) or trusts the checkpoint (`--trust-checkpoint-code`); a model
file runs only if its sha256 is still the one recorded when the checkpoint was saved.
"""

import dataclasses

from zmqflow.common.checkpoints.checkpoint import Checkpoint, find_checkpoint
from zmqflow.common.errors import InvalidArgumentError, PermissionDeniedError
from zmqflow.models.builtin import BUILDERS
from zmqflow.models.registry import load_model
from zmqflow.models.spec import is_model_file, resolve_model
from zmqflow.models.user_file import file_sha256

MODEL_SHA256 = "model_sha256"   # the config key a checkpoint records its model file's sha256 under


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
    def open(cls, directory, model_spec=None, backend="numpy", trust_checkpoint_code=False):
        """The checkpoint `directory` names (a ckpt-<step>, or the latest one in it), its model rebuilt."""
        ckpt = Checkpoint(find_checkpoint(directory))
        spec = model_spec_of(ckpt, model_spec, trust_checkpoint_code)
        model = load_model(spec, backend=backend)
        return cls(ckpt.path, ckpt.step, spec, recorded_data(ckpt), model, read_params(model, ckpt))


def model_spec_of(ckpt, model_spec=None, trust_checkpoint_code=False):
    """The spec to rebuild `ckpt`'s model (a Checkpoint, or None when there is none yet): `model_spec`
    (a --model value) when given, else the one the checkpoint records (code only if trusted:
    check_recorded_model), else the MNIST MLP. A `model_spec` that names just the recorded model's type
    (`--model path/model.py:build`) is the operator naming that code: the recorded spec, options and all."""
    recorded = ckpt.config.get("model") if ckpt is not None else None
    if not isinstance(recorded, dict):
        return resolve_model(model_spec)
    if model_spec is None:
        check_recorded_model(ckpt, recorded, trust_checkpoint_code)
        return recorded
    named = resolve_model(model_spec)
    return recorded if named == {"type": recorded.get("type")} else named


def check_recorded_model(ckpt, spec, trust_checkpoint_code):
    """PermissionDenied unless the model `ckpt` records may be built: a built-in, or code the operator
    trusts whose file (a model file) still has the sha256 recorded at save time."""
    kind = spec.get("type")
    if isinstance(kind, str) and kind in BUILDERS:
        return
    if not trust_checkpoint_code:
        raise PermissionDeniedError(
            f"checkpoint {ckpt.path} names the model {kind!r}, which is not a built-in model "
            f"({', '.join(BUILDERS)}): building it would import and run that code. A checkpoint is data and "
            f"runs no code of its own. If you trust this code, give the model yourself (--model {kind}, "
            "model_spec= in Python) or pass --trust-checkpoint-code (trust_checkpoint_code=True in Python).")
    if isinstance(kind, str) and is_model_file(kind):
        recorded, path = ckpt.config.get(MODEL_SHA256), kind.rpartition(":")[0]
        now = file_sha256(path)
        if recorded is not None and now != recorded:
            raise PermissionDeniedError(
                f"model file {path!r} has sha256 {now or '(missing)'}, but checkpoint {ckpt.path} was saved "
                f"with sha256 {recorded}: the file changed since, so it is not the code the checkpoint was "
                f"trained with. Not run, even with --trust-checkpoint-code; give --model {kind} to run the "
                "file as it is now.")


def with_model_sha256(config):
    """A checkpoint's config with the sha256 of its model file recorded (what check_recorded_model
    compares at load), when its model is a function in a file."""
    model = config.get("model")
    kind = model.get("type") if isinstance(model, dict) else None
    if not (isinstance(kind, str) and is_model_file(kind)):
        return config
    digest = file_sha256(kind.rpartition(":")[0])
    return {**config, MODEL_SHA256: digest} if digest else config


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
