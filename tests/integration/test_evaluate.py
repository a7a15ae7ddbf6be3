"""`zmqflow evaluate`: a trained checkpoint scored again in one process gives the chief's figure;
a checkpoint read into the wrong model, or no checkpoint, is a clear error."""

import json
import subprocess
import sys

import numpy as np
import pytest

from zmqflow.jobs.evaluate import metrics

pytestmark = pytest.mark.integration


def zmqflow(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "zmqflow", *args], capture_output=True, text=True, timeout=timeout)


def test_evaluate_gives_the_chiefs_test_accuracy_for_the_model_the_checkpoint_records(tmp_path):
    directory = str(tmp_path / "ckpt")
    trained = zmqflow("train", "--model", "logistic", "--epochs", "2", "--checkpoint-dir", directory, "--json")
    assert trained.returncode == 0, trained.stderr[-3000:]
    summary = json.loads(trained.stdout.strip().splitlines()[-1])
    done = zmqflow("evaluate", "--checkpoint", directory, "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["model"]["type"] == "logistic" and result["examples"] == 500
    assert result["metrics"]["accuracy"] == pytest.approx(summary["test_accuracy"], abs=1e-9)
    assert result["step"] == summary["global_step"] and 0 < result["metrics"]["log_loss"] < 1.0
    wrong = zmqflow("evaluate", "--checkpoint", directory, "--model", "mlp")
    assert wrong.returncode == 1 and "has no variable 'hidden/weights': was it saved from another model" in wrong.stderr
    empty = zmqflow("evaluate", "--checkpoint", str(tmp_path))
    assert empty.returncode == 1 and "no committed checkpoint in" in empty.stderr


def test_metrics_follow_the_output_classes_or_one_value():
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]])
    assert metrics(probabilities, np.array([0, 1, 1])) == pytest.approx(
        {"accuracy": 2 / 3, "log_loss": -np.mean(np.log([0.9, 0.8, 0.4]))})
    regression = metrics(np.array([[1.0], [2.0], [4.0]]), np.array([1.0, 3.0, 3.0]))
    assert regression == pytest.approx({"rmse": np.sqrt(2 / 3), "mae": 2 / 3, "r2": 1 - (2 / 3) / np.var([1, 3, 3])})
