"""`zmqflow export`: a checkpoint's model written as an ONNX file, for runtimes other than zmqflow's.

The model is loaded as a model server loads it (the spec the checkpoint records, rebuilt by the
registry, every variable read whatever the number of shards it was saved from), so the file
computes what `zmqflow serve --checkpoint` answers for tensor requests. The graph itself is
models/onnx_export.py's.
"""

import collections
import json
import os

from zmqflow import __version__
from zmqflow.common.checkpoint import MANIFEST, Checkpoint, latest_checkpoint
from zmqflow.common.errors import InvalidArgumentError, NotFoundError
from zmqflow.jobs.evaluate import checkpoint_params
from zmqflow.models.onnx_export import DEFAULT_OPSET, onnx_module, to_onnx
from zmqflow.models.registry import checkpoint_model_spec, load_model
from zmqflow.services.serve.server import default_model_name

FORMATS = ("onnx",)


def resolve_checkpoint(directory):
    """(checkpoint path, model directory): `directory` is one checkpoint (ckpt-<step>) or the directory
    whose `latest` names one, as `zmqflow serve --checkpoint` takes."""
    if os.path.isfile(os.path.join(directory, MANIFEST)):
        return os.path.normpath(directory), os.path.dirname(os.path.normpath(directory))
    path = latest_checkpoint(directory)
    if path is None:
        raise NotFoundError(f"no committed checkpoint in {directory!r} (neither a ckpt-<step> directory nor one "
                            "with a `latest` checkpoint)")
    return path, directory


def export_checkpoint(directory, out_path, fmt="onnx", opset=DEFAULT_OPSET, name=None):
    """Write the checkpoint's model to `out_path`; returns what was written (inputs, outputs, ops, bytes)."""
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    onnx = onnx_module()
    path, root = resolve_checkpoint(directory)
    ckpt = Checkpoint(path)
    recorded = ckpt.config.get("model")
    spec = recorded if isinstance(recorded, dict) else checkpoint_model_spec(None)   # the server's fallback
    model = load_model(spec, backend="numpy")
    params = checkpoint_params(model, path)
    name = name or default_model_name(root, ())
    extra = {"zmqflow.model_spec": json.dumps(spec, sort_keys=True, default=str)}
    if ckpt.config.get("data"):
        extra["zmqflow.data_spec"] = json.dumps(ckpt.config["data"], sort_keys=True, default=str)
    proto = to_onnx(model, params, opset=opset, name=name, step=ckpt.step, version=__version__,
                    extra_metadata=extra)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    onnx.save(proto, out_path)
    return {"path": out_path, "format": fmt, "bytes": os.path.getsize(out_path), "opset": int(opset),
            "model": name, "step": ckpt.step, "checkpoint": path,
            "inputs": [_describe(onnx, v) for v in proto.graph.input],
            "outputs": [_describe(onnx, v) for v in proto.graph.output],
            "nodes": len(proto.graph.node), "ops": dict(collections.Counter(n.op_type for n in proto.graph.node))}


def _describe(onnx, value_info):
    tensor = value_info.type.tensor_type
    shape = [d.dim_param or d.dim_value for d in tensor.shape.dim]
    return {"name": value_info.name, "shape": shape,
            "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name}
