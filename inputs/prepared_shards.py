"""A data spec's train split, prepared once and written as fixed-length record shards for the readers.

Why: a deployment (docker compose, Kubernetes) has no launcher to read the user's files, fit the
statistics and feed the rows. `zmqflow data prepare` does it once, as a one-shot task:

    prepare_for_readers("my.yaml", "/data/prepared", model={"type": "mlp", ...})   # a resolved model spec
    # /data/prepared/data-config.json   the spec and its train-split statistics (+ "shards": where and how)
    # /data/prepared/model.json         the model fitted to the data's inputs and classes
    # /data/prepared/train-00-of-08.bin ...   records of the model's inputs and label, little-endian

Every record holds the queue's components in order (inputs/spec_stream.py's queue_components):
each input's float32 / int64 values, then the label (int32 class id, or float32 values). Readers
stream them with the fixed_length format and no parsing (`zmqflow reader --data-config ...`);
the rows are in a seeded random order, so every shard holds every class.
"""

import json
import os

import numpy as np

from zmqflow.inputs.data_spec import fit, load_spec, load_tables, model_for_data, prepare, to_config
from zmqflow.inputs.datasets import write_shards
from zmqflow.inputs.spec_stream import queue_components

SHARD_PATTERN = "train-*-of-*.bin"


def record_dtype(spec):
    """The packed little-endian record of one prepared row: every component of the spec's queue."""
    return np.dtype([(name, np.dtype(dtype).newbyteorder("<"), tuple(shape))
                     for name, dtype, shape in queue_components(spec)])


def record_layout(spec):
    """The fixed_length format's options that read `record_dtype`'s records back."""
    dtype = record_dtype(spec)
    return {"record_bytes": dtype.itemsize,
            "fields": [[name, dtype.fields[name][0].base.str, dtype.fields[name][1], list(dtype.fields[name][0].shape)]
                       for name in dtype.names]}


def write_prepared_shards(spec, prepared, directory, shards=8, seed=0):
    """The prepared rows as `shards` record files in a seeded order; each replaced atomically, stale
    shards of another count removed. Returns the paths."""
    dtype = record_dtype(spec)
    columns = dict(prepared.x) if isinstance(prepared.x, dict) else {"input": prepared.x}
    columns["label"] = prepared.y
    records = np.empty(prepared.rows, dtype)
    for name in dtype.names:
        records[name] = columns[name].reshape(records[name].shape)
    return write_shards(records[np.random.default_rng(seed).permutation(prepared.rows)], directory, shards)


def prepare_for_readers(data, directory, model, shards=8, seed=0):
    """Fit the spec on its train split, write the prepared shards, data-config.json and model.json (`model`,
    a resolved model spec, fitted to the data) into `directory`; returns a summary (rows, record bytes,
    paths, the model's type)."""
    spec = load_spec(data)
    tables = load_tables(spec)
    fit(spec, tables["train"])
    done = write_prepared(spec, prepare(spec, tables["train"]), model, directory, shards, seed)
    return {"name": spec.name, "task": spec.label.task, "rows": done["rows"],
            "splits": {s: len(t) for s, t in tables.items()}, "record_bytes": record_layout(spec)["record_bytes"],
            "shards": done["shards"], "model": done["model"]["type"], "directory": os.path.abspath(directory)}


def write_prepared(spec, train, model, directory, shards=8, seed=0):
    """A fitted spec's prepared train split (`train`) as `shards` record files (none with 0), its
    data-config.json and model.json (`model` fitted to the data) in `directory`: what every task of a job
    reads. Returns {rows, shards, model}."""
    os.makedirs(directory, exist_ok=True)
    fitted = model_for_data(spec, model)
    paths = write_prepared_shards(spec, train, directory, shards, seed) if shards else []
    config = {**to_config(spec), "train_rows": train.rows}
    if shards:
        config["shards"] = {"files": os.path.join(os.path.abspath(directory), SHARD_PATTERN),
                            "format": "fixed_length", "options": record_layout(spec)}
    _write_json(os.path.join(directory, "data-config.json"), config)
    _write_json(os.path.join(directory, "model.json"), fitted)
    return {"rows": train.rows, "shards": paths, "model": fitted}


def _write_json(path, value):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
    os.replace(tmp, path)
