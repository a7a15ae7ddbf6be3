"""`zmqflow export`: a checkpoint's model written as an ONNX file, for runtimes other than zmqflow's.

The model is loaded as a model server loads it (the spec the checkpoint records, rebuilt by the
registry, every variable read whatever the number of shards it was saved from), so the file
computes what `zmqflow serve --checkpoint` answers for tensor requests. The graph itself is
models/onnx_export.py's.
"""

import collections
import json
import os

from zmqflow.common.version import __version__
from zmqflow.common.checkpoints.checkpoint import MANIFEST
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.models.onnx_export import DEFAULT_OPSET, onnx_module, to_onnx
from zmqflow.models.saved import LoadedCheckpoint
from zmqflow.services.serve.server import default_model_name

FORMATS = ("onnx",)


def export_checkpoint(directory, out_path, fmt="onnx", opset=DEFAULT_OPSET, name=None, trust_checkpoint_code=False):
    """Write the checkpoint's model to `out_path`; returns what was written (inputs, outputs, ops, bytes)."""
    if fmt not in FORMATS:
        raise InvalidArgumentError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    onnx = onnx_module()
    loaded = LoadedCheckpoint.open(directory, trust_checkpoint_code=trust_checkpoint_code)
    name = name or default_model_name(model_directory(directory), ())
    extra = {"zmqflow.model_spec": json.dumps(loaded.spec, sort_keys=True, default=str)}
    if loaded.data:
        extra["zmqflow.data_spec"] = json.dumps(loaded.data, sort_keys=True, default=str)
    proto = to_onnx(loaded.model, loaded.params, opset=opset, name=name, step=loaded.step, version=__version__,
                    extra_metadata=extra)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    onnx.save(proto, out_path)
    return {"path": out_path, "format": fmt, "bytes": os.path.getsize(out_path), "opset": int(opset),
            "model": name, "step": loaded.step, "checkpoint": loaded.path,
            "inputs": [_describe(onnx, v) for v in proto.graph.input],
            "outputs": [_describe(onnx, v) for v in proto.graph.output],
            "nodes": len(proto.graph.node), "ops": dict(collections.Counter(n.op_type for n in proto.graph.node))}


def model_directory(directory):
    """The directory a model is named after: the one holding `directory` when it is one ckpt-<step>."""
    directory = os.path.normpath(directory)
    return os.path.dirname(directory) if os.path.isfile(os.path.join(directory, MANIFEST)) else directory


def _describe(onnx, value_info):
    tensor = value_info.type.tensor_type
    shape = [d.dim_param or d.dim_value for d in tensor.shape.dim]
    return {"name": value_info.name, "shape": shape,
            "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name}
