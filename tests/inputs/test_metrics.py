"""Task metrics against hand-computed and scikit-learn's documented values."""

import numpy as np
import pytest

from zmqflow.inputs.metrics import metrics

pytestmark = pytest.mark.unit


def test_metrics_follow_the_task():
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    assert metrics(probabilities, np.array([0, 1, 1])) == pytest.approx(
        {"accuracy": 2 / 3, "log_loss": -np.mean(np.log([0.9, 0.8, 0.4])), "macro_f1": (2 / 3 + 2 / 3) / 2})
    scores = np.array([0.1, 0.4, 0.35, 0.8])           # scikit-learn's roc_auc_score example: 0.75
    binary = metrics(np.stack([1 - scores, scores], axis=1), np.array([0, 0, 1, 1]), task="binary")
    assert binary["auc"] == pytest.approx(0.75)
    multi = metrics(np.array([[0.9, 0.2], [0.4, 0.7]]), np.array([[1, 0], [1, 1]]), task="multi_label")
    assert multi["accuracy"] == pytest.approx(0.75)
    regression = metrics(np.array([[1.0], [2.0], [4.0]]), np.array([1.0, 3.0, 3.0]))
    assert regression == pytest.approx({"rmse": np.sqrt(2 / 3), "mae": 2 / 3, "r2": 1 - (2 / 3) / np.var([1, 3, 3])})


def test_float32_probabilities_of_one_keep_the_log_loss_finite():
    outputs = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    assert np.isfinite(metrics(outputs, np.array([[1, 0], [0, 1]]), task="multi_label")["log_loss"])
    assert np.isfinite(metrics(outputs, np.array([0, 0]))["log_loss"])
