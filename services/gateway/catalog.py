"""The models the gateway serves and their Open Inference Protocol metadata, built from `model_info` answers.

A model trained on a data spec also takes its raw feature columns, one protocol input per column
(BYTES for a categorical one, numbers for a numeric one), as MLServer's pandas codec sends a table;
its metadata lists them under `raw_inputs`, and a classifier's `predicted` output names each row's
class. Why a catalog of plain values: the HTTP side looks a model up by name on every request, and the
ZeroMQ side rebuilds the table in the background (members join, leave, die), so the table is a
value swapped whole, never edited in place. Behind an aggregator the ensemble is one model and each
member is a model of its own (answered by that member directly); in front of one model server,
that server's model is the only one. Plain code, no sockets.
"""

from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

from zmqflow.common.errors import InvalidArgumentError, NotFoundError

DATATYPES = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
             "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
             "float32": "FP32", "float64": "FP64", "bfloat16": "BF16", "string": "BYTES"}
"""numpy / wire dtype name -> the protocol's datatype name."""

EXTENSIONS = ("binary_tensor_data",)
"""The protocol's extensions this gateway serves (the server metadata's `extensions`)."""

ENSEMBLE, MEMBER, SERVER = "ensemble", "member", "server"
CLASSIFICATION_OUTPUT, VALUE_OUTPUT = "probabilities", "predictions"


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple  # per example; the batch dimension (-1) comes first in metadata

    def metadata(self):
        return {"name": self.name, "datatype": self.datatype, "shape": [-1, *self.shape]}


PREDICTED_OUTPUT = TensorSpec("predicted", "BYTES", ())
"""A classifier's class name per row: answered when asked for, and by default to a raw-columns request."""


@dataclass(frozen=True)
class ServedModel:
    name: str
    kind: str                   # ensemble, member or server
    address: str                # the ZeroMQ service that answers it (an aggregator, a member, a server)
    version: str
    inputs: tuple               # TensorSpec per model input, in the model's order
    output: TensorSpec
    ready: bool = True
    members: tuple = ()         # an ensemble's members: (address, name)
    columns: tuple = ()         # TensorSpec per raw feature column (trained on a data spec), else none
    classes: tuple = ()         # a classifier's class names (its `predicted` output), else none

    def metadata(self):
        answer = {"name": self.name, "versions": [self.version], "platform": f"zmqflow_{self.kind}",
                  "inputs": [spec.metadata() for spec in self.inputs],
                  "outputs": [spec.metadata() for spec in self.outputs]}
        if self.columns:
            answer["raw_inputs"] = [spec.metadata() for spec in self.columns]
        return answer

    @property
    def outputs(self):
        return (self.output, PREDICTED_OUTPUT) if self.classes else (self.output,)

    def member_name(self, address):
        """The model name of an ensemble member's address (the address itself if the member is unknown)."""
        return dict(self.members).get(address, address)


@dataclass(frozen=True)
class Catalog:
    models: dict = field(default_factory=dict)   # name -> ServedModel
    loaded: bool = False                         # whether the upstream has answered at least once

    def get(self, name, version=None):
        model = self.models.get(name)
        if model is None:
            known = ", ".join(sorted(self.models)) or "none yet"
            raise NotFoundError(f"unknown model {name!r:.100}; this gateway serves: {known}")
        if version not in (None, "", model.version):
            raise NotFoundError(f"model {name!r} has no version {version!r:.40}; it serves version {model.version}")
        return model


def server_metadata():
    """The protocol's server metadata: this server's name, its release and its extensions (REST and gRPC)."""
    try:
        release = version("zmqflow")
    except PackageNotFoundError:
        release = "unknown"
    return {"name": "zmqflow", "version": release, "extensions": list(EXTENSIONS)}


def model_from_info(info, kind, address, name=None, ready=True, members=()):
    """A ServedModel from a model server's `model_info` answer (its schema: inputs, output width, task)."""
    schema = info.get("schema") if isinstance(info, dict) else None
    if not isinstance(schema, dict) or not schema.get("inputs"):
        raise InvalidArgumentError(f"model_info of {address} has no schema: {info!r:.200}")
    inputs = tuple(TensorSpec(str(spec["name"]), datatype_of(spec["dtype"]), tuple(int(d) for d in spec["shape"]))
                   for spec in schema["inputs"])
    output = schema.get("output") or {}
    output_name = VALUE_OUTPUT if output.get("task") == "regression" else CLASSIFICATION_OUTPUT
    columns = tuple(TensorSpec(str(column), "BYTES" if feature["type"] == "categorical" else "FP32", ())
                    for feature in schema.get("features") or () for column in feature["columns"])
    return ServedModel(name or str(info.get("model") or "model"), kind, address, str(info.get("version") or 1), inputs,
                       TensorSpec(output_name, "FP32", (int(output.get("width") or info.get("classes") or -1),)),
                       ready, tuple(members), columns, tuple(str(c) for c in output.get("classes") or ()))


def datatype_of(dtype_name):
    try:
        return DATATYPES[str(dtype_name)]
    except KeyError:
        raise InvalidArgumentError(f"dtype {dtype_name!r} has no Open Inference Protocol datatype") from None


def unique_names(names):
    """The names, each made unique by a -2, -3, ... suffix when it repeats (members of one checkpoint name)."""
    seen, out = {}, []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}-{seen[name]}")
    return out
