"""Task metrics against hand-computed values, scikit-learn's documented ones, and scikit-learn itself."""

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


@pytest.fixture
def sklearn_metrics():
    return pytest.importorskip("sklearn.metrics", reason="checking against scikit-learn needs it: "
                                                         "pip install 'zmqflow[test]'")


@pytest.mark.parametrize("seed", range(5))
def test_every_task_metric_matches_scikit_learn_on_random_data_with_ties(sklearn_metrics, seed):
    sk = sklearn_metrics
    rng = np.random.default_rng(seed)
    n, k = 500, 4
    logits = np.round(rng.normal(size=(n, k)), 1)                        # rounded: many tied scores
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    y = rng.integers(0, k, n)
    got = metrics(probabilities, y, task="multiclass")
    assert got["accuracy"] == pytest.approx(sk.accuracy_score(y, probabilities.argmax(axis=1)), abs=1e-12)
    assert got["log_loss"] == pytest.approx(sk.log_loss(y, probabilities, labels=range(k)), abs=1e-9)
    assert got["macro_f1"] == pytest.approx(sk.f1_score(y, probabilities.argmax(axis=1), average="macro"), abs=1e-12)

    scores = np.clip(np.round(rng.random(n), 1), 0.05, 0.95)             # 11 distinct values over 500 rows
    labels = (rng.random(n) < 0.3 + 0.4 * scores).astype(int)
    binary = metrics(np.stack([1 - scores, scores], axis=1), labels, task="binary")
    assert abs(binary["auc"] - sk.roc_auc_score(labels, scores)) < 1e-9
    assert binary["log_loss"] == pytest.approx(sk.log_loss(labels, scores), abs=1e-9)

    tags = rng.integers(0, 2, (n, 3))
    p = rng.random((n, 3))
    multi = metrics(p, tags, task="multi_label")
    assert multi["accuracy"] == pytest.approx(1 - sk.hamming_loss(tags, p > 0.5), abs=1e-12)
    assert multi["log_loss"] == pytest.approx(sk.log_loss(tags.ravel(), p.ravel()), abs=1e-9)

    target = rng.normal(3, 2, n)
    predicted = target + rng.normal(0, 1, n)
    regression = metrics(predicted.reshape(n, 1), target)
    assert regression["rmse"] == pytest.approx(np.sqrt(sk.mean_squared_error(target, predicted)), abs=1e-9)
    assert regression["mae"] == pytest.approx(sk.mean_absolute_error(target, predicted), abs=1e-9)
    assert regression["r2"] == pytest.approx(sk.r2_score(target, predicted), abs=1e-9)


def test_auc_with_every_score_tied_or_one_class():
    assert metrics(np.full((4, 2), 0.5), np.array([0, 1, 0, 1]), task="binary")["auc"] == 0.5
    assert np.isnan(metrics(np.full((3, 2), 0.5), np.array([1, 1, 1]), task="binary")["auc"])
