"""A small tabular data set (numeric, categorical, a class label and a value) and checkpoints of
models fitted to it, written without training: for tests of serving, ensembles and predictions."""

import numpy as np

from zmqflow.common.checkpoints.checkpoint import save_params
from zmqflow.inputs.data_spec import fit, load_tables, model_for_data, to_config
from zmqflow.models.registry import load_model
from zmqflow.models.saved import with_model_sha256
from zmqflow.models.spec import resolve_model

CITIES = ["paris", "rome", "oslo"]


def write_csv(path, rows, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        f.write("age,city,size,species\n")
        for _ in range(rows):
            age, city = rng.normal(40, 10), CITIES[rng.integers(3)]
            f.write(f"{age:.1f},{city},{rng.normal():.3f},{'cat' if age > 40 else 'dog'}\n")


def spec_dict(path, encode="one_hot", task="multiclass", split=None):
    """Classes `species` from age, size and city; or (regression) the value `size` from age and city."""
    city = {"type": "categorical", "vocabulary": CITIES, "encode": encode}
    features = ({"age": "numeric", "city": city} if task == "regression"
                else {"age": "numeric", "size": "numeric", "city": city})
    return {"files": {"train": str(path)}, "features": features,
            "label": {"column": "size" if task == "regression" else "species", "task": task},
            **({"split": split} if split else {})}


def checkpoint(directory, spec, model_spec, seed):
    """A checkpoint of `model_spec` fitted to `spec`, with random parameters, recording the data (and, as the
    chief does, a model file's sha256)."""
    fit(spec, load_tables(spec)["train"])
    model_spec = model_for_data(spec, resolve_model(model_spec))
    model = load_model(model_spec)
    params = model.initial_values(seed)
    save_params(str(directory), 1, params, with_model_sha256({"model": model_spec, "data": to_config(spec)}))
    return model, params
