"""Ranking, keeping the best k checkpoints, the JSON/CSV files and the plot, without sockets."""

import csv
import json
import os
import sys

import pytest

from zmqflow.jobs.sweep import leaderboard
from zmqflow.jobs.sweep.plot import plot
from zmqflow.jobs.sweep.space import DEFAULTS

pytestmark = pytest.mark.unit


def _entries(tmp_path):
    entries = []
    for name, acc, loss in [("run-001", 0.80, 0.9), ("run-002", 0.91, 0.4), ("run-003", 0.91, 0.3),
                            ("run-004", 0.85, 0.6)]:
        ckpt = tmp_path / "checkpoints" / name
        ckpt.mkdir(parents=True)
        (ckpt / "model.json").write_text("{}")
        entries.append({"run_id": name, "status": "ok", "hyperparameters": {**DEFAULTS, "hidden": [64, 32]},
                        "model": {"layers": [784, 64, 32, 10]}, "validation_accuracy": acc, "final_loss": loss,
                        "checkpoint": str(ckpt), "model_file": str(ckpt / "model.json"), "curve_file": None})
    entries.append({"run_id": "run-005", "status": "failed", "hyperparameters": dict(DEFAULTS), "model": {},
                    "error": "RuntimeError: boom", "curve_file": None})
    return entries


def test_rank_keep_best_and_write(tmp_path):
    ranked = leaderboard.rank(_entries(tmp_path))
    assert [e["run_id"] for e in ranked] == ["run-003", "run-002", "run-004", "run-001", "run-005"]
    assert [e["rank"] for e in ranked] == [1, 2, 3, 4, None]  # a tie goes to the lower loss; failed runs last
    kept = leaderboard.keep_best(ranked, 2)
    assert [e["run_id"] for e in kept] == ["run-003", "run-002"]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["run-002", "run-003"]
    assert ranked[2]["checkpoint"] is None and ranked[4]["kept"] is False
    json_path, csv_path = leaderboard.write(str(tmp_path), ranked, {"runs": 5})
    document = json.loads(open(json_path).read())
    assert [b["run_id"] for b in document["best"]] == ["run-003", "run-002"]
    assert document["best"][0]["model"]["layers"] == [784, 64, 32, 10]
    rows = list(csv.DictReader(open(csv_path)))
    assert [r["run_id"] for r in rows] == ["run-003", "run-002", "run-004", "run-001", "run-005"]
    assert rows[0]["hidden"] == "64x32" and rows[4]["rank"] == "" and rows[4]["error"] == "RuntimeError: boom"


def test_keep_zero_deletes_every_checkpoint(tmp_path):
    assert leaderboard.keep_best(leaderboard.rank(_entries(tmp_path)), 0) == []
    assert os.listdir(tmp_path / "checkpoints") == []


def test_plot_is_skipped_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails as if it were not installed
    assert plot(str(tmp_path), leaderboard.rank(_entries(tmp_path))) is None
    assert not (tmp_path / "sweep.png").exists()


def test_runs_of_a_regression_rank_by_lower_rmse():
    entries = [{"run_id": f"run-00{i}", "status": "ok", "validation_metric": "rmse", "validation_score": score,
                "validation_accuracy": None, "final_loss": 1.0} for i, score in ((1, 0.5), (2, 0.2), (3, 0.9))]
    ranked = leaderboard.rank(entries)
    assert [e["run_id"] for e in ranked] == ["run-002", "run-001", "run-003"] and ranked[0]["rank"] == 1
    assert leaderboard.better(entries[1], entries[0]) and not leaderboard.better(entries[2], entries[0])
