"""`zmqflow evaluate`: a trained checkpoint scored again in one process gives the chief's figure;
a checkpoint read into the wrong model, or no checkpoint, is a clear error."""

import json
import subprocess
import sys

import pytest


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
    assert wrong.returncode == 2 and "has no variable 'hidden/weights': was it saved from another model" in wrong.stderr
    empty = zmqflow("evaluate", "--checkpoint", str(tmp_path))
    assert empty.returncode == 1 and "no committed checkpoint in" in empty.stderr
