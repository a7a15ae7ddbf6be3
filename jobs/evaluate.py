"""`zmqflow evaluate`: a checkpoint's model on a labelled split, in this process, no service running.

The model is the one the checkpoint records (or `--model`); its variables are read from the
checkpoint whatever the number of shards it was saved from. Metrics follow the task
(inputs/metrics.py), guessed from the outputs when not given.
"""

import time

import numpy as np

from zmqflow.common.checkpoints.checkpoint import Checkpoint, latest_checkpoint
from zmqflow.common.errors import InvalidArgumentError
from zmqflow.inputs.metrics import metrics
from zmqflow.models.kernels import DEFAULT_BACKEND
from zmqflow.models.saved import LoadedCheckpoint, recorded_data


def outputs_of(predict, x, batch=500):
    """`predict` over every row of `x` (one array, or {input: array}) in batches, outputs joined."""
    rows = len(next(iter(x.values()))) if isinstance(x, dict) else len(x)
    take = (lambda i: {k: v[i:i + batch] for k, v in x.items()}) if isinstance(x, dict) else (lambda i: x[i:i + batch])
    return np.concatenate([np.asarray(predict(take(start))) for start in range(0, rows, batch)])


def evaluate_checkpoint(checkpoint_dir, x, y, model_spec=None, backend=DEFAULT_BACKEND, batch_size=1000, task=None,
                        trust_checkpoint_code=False):
    """{"metrics", "examples", "step", "model", "checkpoint", "seconds"} of the latest checkpoint in `checkpoint_dir`."""
    loaded = LoadedCheckpoint.open(checkpoint_dir, model_spec, backend, trust_checkpoint_code)
    model, params = loaded.model, loaded.params
    started = time.perf_counter()
    outputs = outputs_of(lambda rows: model.predict(params, rows), x, batch_size)
    return {"metrics": metrics(outputs, y, task), "examples": int(len(y)), "step": loaded.step,
            "model": loaded.spec, "checkpoint": loaded.path, "seconds": round(time.perf_counter() - started, 3)}


def labelled_split(data_spec=None, split="test", checkpoint_dir=None):
    """(spec, Prepared) of `split`: of `data_spec` (a YAML path, a dict, `mnist`), else of the spec the
    checkpoint records (trained with --data), else of the shipped MNIST sample; statistics fitted on
    the train split, as training did. InvalidArgument when the data has no such split."""
    from zmqflow.inputs.data_spec import fit, load_spec, load_tables, prepare
    if data_spec is None and checkpoint_dir:
        path = latest_checkpoint(checkpoint_dir)
        recorded = recorded_data(Checkpoint(path)) if path else None
        data_spec = recorded["spec"] if recorded else None
    data = load_spec(data_spec if data_spec is not None else "mnist")
    tables = load_tables(data)
    if split not in tables:
        raise InvalidArgumentError(f"the data has no {split} split (it has {', '.join(tables)})")
    fit(data, tables["train"])
    return data, prepare(data, tables[split])
