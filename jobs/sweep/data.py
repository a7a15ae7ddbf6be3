"""The sweep's data: MNIST's training split with a seeded validation split carved out of it.

Runs train only on the rest, so validation accuracy ranks models on rows none of them saw;
the test split (every 10th row) stays untouched as in `zmqflow train`.
"""

import numpy as np

from zmqflow.inputs.datasets import mnist_split


def sweep_split(validation_fraction=0.1, seed=0):
    """((train_x, train_y), (val_x, val_y)): the same rows for the same fraction and seed."""
    if not 0 < validation_fraction < 1:
        raise ValueError(f"the validation fraction must be in (0, 1), got {validation_fraction}")
    (x, y), _ = mnist_split()
    order = np.random.default_rng([seed, 1729]).permutation(len(y))
    n_val = max(1, int(round(len(y) * validation_fraction)))
    val, train = np.sort(order[:n_val]), np.sort(order[n_val:])
    return (x[train], y[train]), (x[val], y[val])


def data_spec_split(spec, validation_fraction=0.1, seed=0):
    """((train_x, train_y), (val_x, val_y)) of a data spec (inputs/data_spec.py), prepared as the model's
    inputs: its own validation split, or a seeded fraction of its train split."""
    from zmqflow.inputs.data_spec import fit, load_tables, prepare
    tables = load_tables(spec)
    train = tables["train"]
    if "validation" in tables:
        validation = tables["validation"]
    else:
        order = np.random.default_rng([seed, 1729]).permutation(len(train))
        n_val = max(1, int(round(len(train) * validation_fraction)))
        validation, train = train.take(np.sort(order[:n_val])), train.take(np.sort(order[n_val:]))
    fit(spec, train)
    prepared = prepare(spec, train), prepare(spec, validation)
    return tuple((p.x, p.y) for p in prepared)
