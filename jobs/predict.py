"""`zmqflow predict`: a checkpoint's model over the rows of a file, written as CSV or JSON lines.

The checkpoint records the model and, when it was trained with `--data`, the data spec and its
train-split statistics: the file's feature columns become the model's inputs exactly as in
training (the label column may be absent). Classifiers write the predicted class and each class's
probability; a regression writes the value.
"""

import csv
import json

import numpy as np

from zmqflow.common.errors import InvalidArgumentError
from zmqflow.inputs.data_spec import from_config, load_spec, model_inputs, read_features
from zmqflow.inputs.predictions import labels_of, predicted
from zmqflow.models.saved import LoadedCheckpoint


def predict_file(checkpoint_dir, path, data_spec=None, batch_size=1000, trust_checkpoint_code=False):
    """(column names, rows) of predictions for every row of `path`."""
    loaded = LoadedCheckpoint.open(checkpoint_dir, trust_checkpoint_code=trust_checkpoint_code)
    recorded = loaded.data
    if data_spec is None and recorded is None:
        raise InvalidArgumentError(f"the checkpoint in {checkpoint_dir} records no data spec (it was not trained "
                                   "with --data): pass --data SPEC")
    spec = from_config(recorded) if data_spec is None else load_spec(data_spec)
    if spec.stats is None:
        raise InvalidArgumentError("pass a checkpoint trained with --data: its statistics make the inputs")
    model, params = loaded.model, loaded.params
    table = read_features(spec, path)
    x = model_inputs(spec, table)
    rows = len(table)
    part = (lambda i: {k: v[i:i + batch_size] for k, v in x.items()}) if isinstance(x, dict) else (
        lambda i: x[i:i + batch_size])
    outputs = np.concatenate([model.predict(params, part(i)) for i in range(0, rows, batch_size)])
    return prediction_rows(spec, outputs)


def prediction_rows(spec, outputs):
    """(column names, rows): the class and each class's probability, the labels' probabilities, or the value."""
    if spec.label.task == "multi_label":
        return list(spec.label.columns), [[round(float(p), 6) for p in row] for row in outputs]
    labels = labels_of(spec)
    answers = predicted(outputs, labels["task"], labels["classes"], labels["columns"])
    if spec.label.task == "regression":
        return ["prediction"], [[value] for value in answers]
    return ["class"] + [f"p_{c}" for c in labels["classes"]], [
        [name] + [round(float(p), 6) for p in row] for name, row in zip(answers, outputs)]


def predict_served(address, path, batch_size=500, timeout=30.0):
    """(column names, rows) of predictions for every row of `path`, asked of a running model server or
    aggregator (only its address: an aggregator relays its members' model_info, so members on names that
    resolve only inside a deployment do not matter): the file is read with the data spec the model's
    checkpoint records and its feature columns are sent as records, made into inputs by the server."""
    from zmqflow.common.clients.aggregator import AggregatorClient
    from zmqflow.common.clients.serve import ModelClient
    with ModelClient(address, timeout=timeout, name="predict") as probe:
        service = probe.info()["service"]
    if service not in ("serve", "aggregator"):
        raise InvalidArgumentError(f"{address} is a {service}, not a model server or an aggregator")
    client = AggregatorClient(address, timeout=timeout) if service == "aggregator" else ModelClient(address, timeout)
    with client:
        schema = client.model_info(timeout=timeout)["schema"]
        if not schema.get("data"):
            raise InvalidArgumentError(f"the model at {address} was not trained with --data: it takes tensors "
                                       f"({schema['inputs']}), not the rows of a file")
        spec = from_config(schema["data"])
        outputs = _served_outputs(client, spec, path, batch_size)
    return prediction_rows(spec, outputs)


def _served_outputs(client, spec, path, batch_size):
    """The served model's outputs for every row of `path`, sent as records in batches."""
    table = read_features(spec, path)
    outputs = []
    for start in range(0, len(table), batch_size):
        records = {str(c): [_plain(v) for v in values[start:start + batch_size]]
                   for c, values in table.columns.items()}
        outputs.append(client.predict_records(records)[0])
    return np.concatenate(outputs)


def _plain(value):
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value.item() if hasattr(value, "item") \
        else value


def write_predictions(columns, rows, out, fmt):
    """CSV with a header, or one JSON object per line."""
    if fmt == "csv":
        writer = csv.writer(out)
        writer.writerow(columns)
        writer.writerows(rows)
        return
    for row in rows:
        out.write(json.dumps(dict(zip(columns, row))) + "\n")
