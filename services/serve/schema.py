"""What a model server accepts, derived from its checkpoint rather than assumed.

The model's input signature gives the tensors a request sends (names, per-example shapes,
dtypes), in signature order or named; when the checkpoint records a data spec (trained with
`--data`), a request may instead send the raw feature columns as `records`
({column: [values]}), made into the model's inputs with the training statistics exactly as
`zmqflow predict` does, and its answer names the predicted classes. Plain code, no sockets.
"""

import numpy as np

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.inputs.data_sources import Table
from zmqflow.inputs.predictions import labels_of, predicted
from zmqflow.models.protocol import input_signature, output_width

CLASSIFICATION = ("multiclass", "binary")


def _data_spec():
    """inputs.data_spec, imported for a checkpoint that records a data spec: its schema (pydantic) costs a model
    server of a plain checkpoint ~0.2 s of start-up (bench startup)."""
    from zmqflow.inputs import data_spec
    return data_spec


class RequestSchema:
    def __init__(self, model, data_config=None):
        self.signature = input_signature(model)       # {name: (shape, dtype)}, in the model's order
        self.names = list(self.signature)
        self.width = output_width(model)
        self.data_config = data_config
        self.data = _data_spec().from_config(data_config) if data_config else None
        self.labels = labels_of(self.data) if self.data is not None else {"task": None, "classes": None,
                                                                          "columns": None}
        self.task = self.labels["task"]
        self.classes = self.labels["classes"] if self.task in CLASSIFICATION else None

    def describe(self):
        """The schema as model_info reports it: inputs, the output, and the raw features (if any)."""
        return {"inputs": [{"name": name, "shape": list(shape), "dtype": dtype}
                           for name, (shape, dtype) in self.signature.items()],
                "output": {"width": self.width, "task": self.task, "classes": self.classes},
                "features": None if self.data is None else [
                    {"name": f.name, "type": f.type, "columns": [str(c) for c in f.columns]}
                    for f in self.data.features],
                "data": self.data_config}

    def shape_text(self):
        return ", ".join(f"{name} [n, {', '.join(map(str, shape))}] {dtype}"
                         for name, (shape, dtype) in self.signature.items())

    # ------------------------------------------------ requests

    def inputs(self, tensors, request):
        """The inputs of a predict `request` (common/wire/protocol.py) as a list in signature order: its tensors
        (positional, or named by its `inputs`) or its raw `records`; every wrong count, name, shape or dtype
        is refused."""
        if request.records is not None:
            if tensors:
                raise InvalidArgumentError("send tensors or records, not both")
            return self.from_records(request.records)
        names = request.inputs or self.names
        if sorted(names) != sorted(self.names) or len(tensors) != len(self.names):
            given = names if request.inputs else f"{len(tensors)} unnamed tensor(s)"
            raise InvalidArgumentError(f"predict takes {len(self.names)} tensor(s): {self.shape_text()}; got {given}")
        by_name = dict(zip(names, tensors))
        arrays = [self._checked(name, by_name[name]) for name in self.names]
        rows = {len(a) for a in arrays}
        if len(rows) != 1:
            raise InvalidArgumentError(f"every input needs the same number of rows, got {sorted(rows)}")
        return arrays

    def _checked(self, name, x):
        shape, dtype = self.signature[name]
        wanted_int = np.dtype(dtype).kind in "iu"
        if x.shape[1:] != tuple(shape) or x.shape[0] == 0 or x.dtype.kind not in ("iu" if wanted_int else "fiu"):
            raise InvalidArgumentError(f"input {name!r} must be {'integers' if wanted_int else 'numbers'} of shape "
                                       f"[n >= 1, {', '.join(map(str, shape))}], got {x.dtype} {list(x.shape)}")
        return x.astype(dtype, copy=False)

    def from_records(self, records):
        """Model inputs from raw feature columns {column: [values]}, with the checkpoint's statistics."""
        if self.data is None:
            raise InvalidArgumentError("this model's checkpoint records no data spec (it was not trained with "
                                       f"--data): send tensors ({self.shape_text()})")
        if not records:
            raise InvalidArgumentError("records is a mapping {column: [values, ...]}")
        columns, rows = {}, None
        for f in self.data.features:
            for column in f.columns:
                values = records.get(str(column))
                if not isinstance(values, list) or not values:
                    raise InvalidArgumentError(f"records lack column {str(column)!r} (feature {f.name!r}) as a "
                                               "non-empty list")
                if rows not in (None, len(values)):
                    raise InvalidArgumentError(f"records: column {str(column)!r} has {len(values)} values, "
                                               f"others {rows}")
                rows = len(values)
                columns[column] = self._column(f, column, values)
        table = Table(columns, ["request"], np.stack([np.zeros(rows, np.int64), np.arange(rows) + 1], axis=1))
        made = _data_spec().model_inputs(self.data, table)
        return [made] if not isinstance(made, dict) else [made[name] for name in self.names]

    @staticmethod
    def _column(feature, column, values):
        if feature.type == "categorical":
            return np.array([str(v).encode() for v in values], dtype=object)
        try:
            return np.array([feature.default if _blank(v) and feature.default is not None else v for v in values],
                            dtype=np.float32)
        except (TypeError, ValueError):
            bad = next(v for v in values if not _is_number(v))
            raise InvalidArgumentError(f"records: column {str(column)!r} (feature {feature.name!r}) holds "
                                       f"{bad!r}, not a number") from None

    def model_input(self, arrays):
        """What the model's predict takes: the one array, or {input name: array}."""
        return arrays[0] if len(arrays) == 1 else dict(zip(self.names, arrays))

    def answer(self, outputs):
        """What a records request gets besides the outputs: each row's prediction, and the labels
        (task, classes) so an aggregator can name the prediction of its combined answer."""
        return {"predicted": predicted(outputs, self.task, self.classes, self.labels["columns"]),
                "labels": self.labels}


def _blank(value):
    """None, or text that is empty once spaces are stripped: a numeric feature's default stands in (as in a CSV)."""
    return value is None or (isinstance(value, str) and not value.strip())


def _is_number(value):
    try:
        float(value)
        return value is not None
    except (TypeError, ValueError):
        return False
