"""Scoring predict functions on a labelled split, in batches (no sockets here)."""

import numpy as np


def outputs_of(predict, x, batch=500):
    """`predict` over every row of `x` (one array, or {input: array}) in batches, outputs joined."""
    rows = len(next(iter(x.values()))) if isinstance(x, dict) else len(x)
    take = (lambda i: {k: v[i:i + batch] for k, v in x.items()}) if isinstance(x, dict) else (lambda i: x[i:i + batch])
    return np.concatenate([np.asarray(predict(take(start))) for start in range(0, rows, batch)])


def accuracy(predict, x, y, batch=500):
    """Share of rows whose arg-max class of `predict(x_batch)` equals the label."""
    if not len(y):
        return 0.0
    return float(np.mean(np.argmax(outputs_of(predict, x, batch), axis=1) == y))


def verdict(ensemble_value, member_values, metric="accuracy", higher_is_better=True):
    """One line answering the seeds' exercise: does the ensemble beat its members (on `metric`)?"""
    best = max(member_values) if higher_is_better else min(member_values)
    gain = ensemble_value - best if higher_is_better else best - ensemble_value
    scale, unit = (100, " points") if metric == "accuracy" else (1, "")
    if gain > 0:
        return f"the ensemble beats its best member by {scale * gain:.{2 if scale == 100 else 4}f}{unit} of {metric}"
    if gain == 0:
        return "the ensemble ties its best member"
    return f"the ensemble trails its best member by {-scale * gain:.{2 if scale == 100 else 4}f}{unit} of {metric}"
