"""`zmqflow ensemble` over a real sweep: servers for the best k, an aggregator, test accuracies."""

import json
import subprocess
import sys

import numpy as np
import pytest

from zmqflow.common.clients.aggregator import AggregatorClient
from zmqflow.common.errors import NotFoundError
from zmqflow.jobs.ensemble.score import verdict
from zmqflow.jobs.evaluate import outputs_of
from zmqflow.jobs.ensemble.launch import Ensemble, best_runs

pytestmark = pytest.mark.integration

ZMQFLOW = [sys.executable, "-m", "zmqflow"]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    subprocess.run([*ZMQFLOW, "sweep", "--grid", "lr=0.003,0.01;hidden=32,64", "--random", "2", "--epochs", "1",
                    "--keep-best", "2", "--parallel", "2", "--out", str(out), "--json"],
                   check=True, timeout=180, capture_output=True)
    return out


def test_ensemble_reports_each_member_and_the_combined_accuracy(sweep_dir, tmp_path):
    result = subprocess.run([*ZMQFLOW, "ensemble", "--sweep", str(sweep_dir), "--top", "2", "--json",
                             "--log-dir", str(tmp_path)], check=True, timeout=120, capture_output=True, text=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert [m["rank"] for m in report["members"]] == [1, 2]
    assert all(0.5 < m["test_accuracy"] <= 1.0 for m in report["members"])  # trained models, not chance (0.1)
    assert set(report["ensemble"]) == {"mean", "vote"} and all(0.5 < a <= 1.0 for a in report["ensemble"].values())
    assert report["verdict"].startswith("the ensemble")


@pytest.mark.faults
def test_the_ensemble_answers_with_every_member_and_without_a_dead_one(sweep_dir, tmp_path):
    runs = best_runs(str(sweep_dir), 2)
    x = np.random.default_rng(0).random((4, 784), dtype=np.float32)
    with Ensemble(runs, log_dir=str(tmp_path), deadline_ms=500) as ensemble:
        with AggregatorClient(ensemble.aggregator.endpoint) as client:
            probabilities, info = client.predict(x, min_members=2)
            assert probabilities.shape == (4, 10) and np.allclose(probabilities.sum(axis=1), 1.0, atol=1e-4)
            assert len(info["answered"]) == 2
            ensemble.members[1].kill()
            probabilities, info = client.predict(x, deadline_ms=300)
            assert probabilities.shape == (4, 10) and len(info["answered"]) == 1


@pytest.mark.unit
def test_a_sweep_without_kept_checkpoints_is_a_clear_error(tmp_path):
    (tmp_path / "leaderboard.json").write_text(json.dumps({"runs": [], "best": []}))
    with pytest.raises(NotFoundError, match="keeps no checkpoint"):
        best_runs(str(tmp_path), 3)
    with pytest.raises(NotFoundError, match="no leaderboard"):
        best_runs(str(tmp_path / "missing"), 3)


@pytest.mark.unit
def test_accuracy_and_verdict():
    x, y = np.eye(3, dtype=np.float32), np.array([0, 1, 1])
    assert np.mean(outputs_of(lambda b: b, x, batch=2).argmax(axis=1) == y) == pytest.approx(2 / 3)
    assert "beats" in verdict(0.9, [0.8, 0.85]) and "ties" in verdict(0.9, [0.9]) and "trails" in verdict(0.8, [0.9])
    assert verdict(0.9, [0.8, 0.85]) == "the ensemble beats its best member by 5.00 points of accuracy"
    assert verdict(0.2, [0.25, 0.3], "rmse", higher_is_better=False) == \
        "the ensemble beats its best member by 0.0500 of rmse"
    assert "trails" in verdict(0.4, [0.25, 0.3], "rmse", higher_is_better=False)
    two_inputs = {"a": np.eye(3, dtype=np.float32), "b": np.zeros((3, 1))}
    assert np.mean(outputs_of(lambda b: b["a"], two_inputs, batch=2).argmax(axis=1) == y) == pytest.approx(2 / 3)


def test_an_ensemble_of_regressions_is_scored_on_the_data_its_checkpoints_record(tmp_path):
    from zmqflow.inputs.data_spec import load_spec, load_tables, model_inputs, labels
    from zmqflow.inputs.metrics import metrics
    from tests.support.tabular import checkpoint, spec_dict, write_csv
    write_csv(tmp_path / "data.csv", 300, seed=3)
    outputs = []
    for name, seed in (("lin-a", 1), ("lin-b", 2)):
        spec = load_spec(spec_dict(tmp_path / "data.csv", task="regression", split={"test": 0.2, "seed": 0}))
        model, params = checkpoint(tmp_path / name, spec, "linear", seed)
        test = load_tables(spec)["test"]
        outputs.append(model.predict(params, model_inputs(spec, test)))
    y = labels(spec, test)
    result = subprocess.run([*ZMQFLOW, "ensemble", "--checkpoint", str(tmp_path / "lin-a"), "--checkpoint",
                             str(tmp_path / "lin-b"), "--json", "--log-dir", str(tmp_path / "logs")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["task"] == "regression" and report["metric"] == "rmse"
    assert set(report["ensemble"]) == {"mean", "median"}
    assert report["members"][0]["test_score"] == pytest.approx(metrics(outputs[0], y, "regression")["rmse"], rel=1e-4)
    assert report["ensemble"]["mean"] == pytest.approx(metrics(np.mean(outputs, axis=0), y, "regression")["rmse"],
                                                       rel=1e-4)
    assert "of rmse" in report["verdict"] or "ties" in report["verdict"]
