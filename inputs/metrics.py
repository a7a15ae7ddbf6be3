"""Task metrics of predictions against labels: what validation, `evaluate` and the job summaries report.

multiclass: accuracy, log-loss, macro-F1; binary: the same and the ROC AUC; multi-label: mean
per-label accuracy and log-loss; regression: RMSE, MAE, R². `task=None` guesses from the outputs
(several per row: multiclass; one: regression). Plain numpy, vectorised; tests/inputs/test_metrics.py
checks every metric against scikit-learn's.
"""

import numpy as np

PRIMARY = {"multiclass": ("accuracy", max), "binary": ("accuracy", max), "multi_label": ("accuracy", max),
           "regression": ("rmse", min)}
"""The metric a best checkpoint is chosen by, and whether higher or lower is better."""

BETTER = {"accuracy": max, "log_loss": min, "macro_f1": max, "auc": max, "rmse": min, "mae": min, "r2": max}
"""Whether a higher (max) or lower (min) value of each metric is better."""

TASK_METRICS = {"multiclass": ("accuracy", "log_loss", "macro_f1"), "binary": ("accuracy", "log_loss", "macro_f1", "auc"),
                "multi_label": ("accuracy", "log_loss"), "regression": ("rmse", "mae", "r2")}


def monitored(task, metric=None):
    """(metric, max | min) that early stopping and the best checkpoint follow: `metric` (checked
    against the task's metrics) or the task's primary one."""
    if metric is None:
        return PRIMARY[task]
    if metric not in TASK_METRICS[task]:
        from zmqflow.common.errors import InvalidArgumentError
        raise InvalidArgumentError(f"a {task} task reports {', '.join(TASK_METRICS[task])}; there is no {metric!r} "
                                   "to monitor")
    return metric, BETTER[metric]


def metrics(outputs, y, task=None):
    outputs, y = np.asarray(outputs), np.asarray(y)
    if task is None:
        task = "multiclass" if outputs.ndim == 2 and outputs.shape[1] > 1 else "regression"
    if task == "regression":
        error = outputs.reshape(len(y)) - y.astype(np.float64)
        variance = float(np.var(y))
        return {"rmse": float(np.sqrt(np.mean(error ** 2))), "mae": float(np.mean(np.abs(error))),
                "r2": 1.0 - float(np.mean(error ** 2)) / variance if variance else float("nan")}
    if task == "multi_label":
        p = np.clip(outputs.astype(np.float64), 1e-12, 1 - 1e-12)
        return {"accuracy": float(np.mean((p > 0.5) == (y > 0.5))),
                "log_loss": float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))}
    y = y.astype(np.int64)
    predicted = np.argmax(outputs, axis=1)
    result = {"accuracy": float(np.mean(predicted == y)),
              "log_loss": float(-np.mean(np.log(np.clip(outputs[np.arange(len(y)), y], 1e-12, 1.0)))),
              "macro_f1": macro_f1(predicted, y, outputs.shape[1])}
    if task == "binary" and outputs.shape[1] == 2:
        result["auc"] = roc_auc(outputs[:, 1], y)
    return result


def macro_f1(predicted, y, classes):
    """The mean over classes of F1 (a class never predicted nor present counts as 0 only if present)."""
    scores = []
    for c in range(classes):
        tp = np.sum((predicted == c) & (y == c))
        fp, fn = np.sum((predicted == c) & (y != c)), np.sum((predicted != c) & (y == c))
        if tp + fp + fn:
            scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores)) if scores else 0.0


def roc_auc(scores, y):
    """The probability that a random positive scores above a random negative, ties counting half (the
    Mann-Whitney statistic from average ranks, as scikit-learn's roc_auc_score): one sort, no loop."""
    scores, y = np.asarray(scores, dtype=np.float64), np.asarray(y)
    positives, negatives = int(np.sum(y == 1)), int(np.sum(y == 0))
    if not positives or not negatives:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    ordered = scores[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])     # where each run of equal scores begins
    ends = np.r_[starts[1:], len(ordered)]
    ranks = np.empty(len(ordered))
    ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)      # a run's mean rank, ranks from 1
    return float((ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))
