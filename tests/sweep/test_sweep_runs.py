"""`zmqflow sweep` for real: a broker, per run a ps task and a worker, on MNIST; kept checkpoints served."""

import csv
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from zmqflow.common.clients.serve import ModelClient
from zmqflow.cli.main import main
from zmqflow.jobs.sweep.data import sweep_split

pytestmark = pytest.mark.integration


def _sweep(args):
    result = CliRunner().invoke(main, ["sweep", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_sweep_ranks_runs_keeps_the_best_and_they_serve(processes, tmp_path):
    out = tmp_path / "sweep"
    output = _sweep(["--grid", "lr=0.01;hidden=32,48x16,24", "--epochs", "2", "--parallel", "2", "--keep-best", "2",
                     "--out", str(out)])
    document = json.loads((out / "leaderboard.json").read_text())
    runs = document["runs"]
    assert len(runs) == 3 and all(r["status"] == "ok" for r in runs), output
    accuracies = [r["validation_accuracy"] for r in runs]
    assert accuracies == sorted(accuracies, reverse=True) and [r["rank"] for r in runs] == [1, 2, 3]
    assert all(a > 0.5 for a in accuracies)
    rows = list(csv.DictReader(open(out / "leaderboard.csv")))
    assert [r["run_id"] for r in rows] == [r["run_id"] for r in runs]
    assert (out / "sweep.png").stat().st_size > 10_000
    # each run's queue lived in its own container: every run saw its own epochs of data, no more, no less
    train, validation = sweep_split()
    for run in runs:
        result = json.loads((out / "runs" / run["run_id"] / "result.json").read_text())
        assert result["examples"] == 2 * len(train[1])
        assert run["curve_points"] >= 2 * len(train[1]) // 100
    kept = [b["checkpoint"] for b in document["best"]]
    assert kept == [r["checkpoint"] for r in runs[:2]] and runs[2]["checkpoint"] is None
    assert sorted(os.listdir(out / "checkpoints")) == sorted(os.path.basename(k) for k in kept)
    layout = " ".join(CliRunner().invoke(main, ["sweep", "--help"]).output.split())   # what --out's help promises
    assert all(f" {named}" in layout for named in ("checkpoints/RUN/", "runs/RUN/logs/", "logs/", "model.json"))
    assert (out / "logs").is_dir() and all((out / "runs" / r["run_id"] / "logs").is_dir() for r in runs)
    assert all(os.path.exists(os.path.join(b["checkpoint"], "model.json")) for b in document["best"])
    for best in document["best"]:
        assert json.loads(open(best["model_file"]).read()) == best["model"]
        server = processes.service("zmqflow.services.serve", ["--checkpoint", best["checkpoint"],
                                                              "--model", best["model_file"], "--backend", "numpy"])
        with ModelClient(server.endpoint, timeout=20) as client:
            probs, info = client.predict(validation[0])
        server.stop()
        assert info["model"] == best["run_id"] and probs.shape == (len(validation[1]), 10)
        assert np.mean(probs.argmax(axis=1) == validation[1]) == pytest.approx(best["validation_accuracy"], abs=1e-3)
    assert sorted(r["model"]["layers"][1:-1] for r in runs) == [[24], [32], [48, 16]]  # none the default 100


def test_a_sweep_over_a_cnns_own_options_trains_and_records_each_model(tmp_path):
    out = tmp_path / "sweep"
    _sweep(["--model", "cnn", "--model-opt", "dense=32", "--grid", "lr=0.003;model.filters=[4,8],[8,16]",
            "--epochs", "1", "--parallel", "2", "--keep-best", "1", "--out", str(out)])
    runs = json.loads((out / "leaderboard.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["ok", "ok"] and all(r["validation_accuracy"] > 0.5 for r in runs)
    assert sorted(r["model"]["filters"] for r in runs) == [[4, 8], [8, 16]]
    assert all(r["model"]["type"] == "cnn" and r["model"]["dense"] == 32 for r in runs)
    best = runs[0]
    assert json.loads(open(best["model_file"]).read()) == best["model"]   # what serve --model reads


def test_a_sweep_on_a_data_spec_fits_every_run_to_the_data(tmp_path):
    from tests.integration.test_train_on_data import write_flowers
    spec = write_flowers(tmp_path, rows=3000)
    out = tmp_path / "sweep"
    _sweep(["--data", spec, "--grid", "lr=0.01;hidden=8,32", "--epochs", "3", "--parallel", "2", "--out", str(out)])
    runs = json.loads((out / "leaderboard.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["ok", "ok"] and all(r["validation_accuracy"] > 0.85 for r in runs), runs
    assert sorted(r["model"]["layers"] for r in runs) == [[6, 8, 3], [6, 32, 3]]   # 2 numeric + 4 colour slots
    # the MLP `zmqflow train --data` fits (DATA_MLP), not the seeds' sigmoid MNIST network
    assert {(r["model"]["activation"], r["model"]["init"], r["hyperparameters"]["batch_size"]) for r in runs} == \
        {("relu", "glorot_uniform", 100)}, runs


def test_a_sweep_on_a_small_data_spec_takes_trains_batch_unless_told():
    """A 300-row CSV: a tenth of its train split a batch (batch_size_for), as `zmqflow train --data`; --batch-size
    and the space's own batch_size win; MNIST keeps 100."""
    from zmqflow.cli.sweep import _points
    from zmqflow.cli.train import fitted_data
    from zmqflow.jobs.spec import batch_size_for
    data = fitted_data(os.path.join(os.path.dirname(__file__), "..", "..", "examples", "data", "flowers.yaml"))
    rows = data.stats["train_rows"]
    assert 100 < rows < 300
    _, _, points = _points("lr=0.01", None, "grid", None, 1, 3, None, data)
    assert points[0]["batch_size"] == batch_size_for(rows) == -(-rows // 10) and points[0]["activation"] == "relu"
    assert _points("lr=0.01", None, "grid", None, 1, 3, 7, data)[2][0]["batch_size"] == 7
    assert _points("lr=0.01;batch=5", None, "grid", None, 1, 3, 7, data)[2][0]["batch_size"] == 5
    assert _points("lr=0.01", None, "grid", None, 1, 3, None)[2][0] == {**_points("lr=0.01", None, "grid", None, 1, 3,
                                                                              100)[2][0], "activation": "sigmoid"}


def test_sweep_with_input_on_the_ps_and_a_failing_run(tmp_path):
    out = tmp_path / "sweep"
    _sweep(["--grid", "optimizer=sgd;lr=0.5", "--epochs", "1", "--input", "ps", "--parallel", "1", "--out", str(out),
            "--json"])
    run = json.loads((out / "leaderboard.json").read_text())["runs"][0]
    assert run["status"] == "ok" and run["validation_accuracy"] > 0.5 and run["kept"]
    output = _sweep(["--grid", "lr=0.01", "--run-timeout-secs", "0.3", "--out", str(out), "--parallel", "1"])
    document = json.loads((out / "leaderboard.json").read_text())
    run = document["runs"][0]
    assert run["status"] == "failed" and "did not finish within 0.3 s" in run["error"] and run["rank"] is None
    assert document["best"] == [] and "FAILED" in output
    assert not os.listdir(out / "checkpoints")


def test_a_regression_sweep_ranks_by_rmse_and_its_best_runs_serve_as_an_ensemble(tmp_path):
    import subprocess
    import sys
    import yaml
    from tests.support.tabular import spec_dict, write_csv
    write_csv(tmp_path / "data.csv", 600, seed=4)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec_dict(
        tmp_path / "data.csv", task="regression", split={"validation": 0.2, "test": 0.2, "seed": 0})))
    out = tmp_path / "sweep"
    _sweep(["--data", str(tmp_path / "spec.yaml"), "--model", "linear", "--grid", "lr=0.0001,0.05",
            "--epochs", "3", "--parallel", "2", "--keep-best", "2", "--out", str(out)])
    document = json.loads((out / "leaderboard.json").read_text())
    runs = document["runs"]
    assert [r["status"] for r in runs] == ["ok", "ok"], runs
    assert all(r["validation_metric"] == "rmse" and r["validation_accuracy"] is None for r in runs)
    assert runs[0]["validation_score"] < runs[1]["validation_score"]       # lower RMSE ranks first
    assert runs[0]["hyperparameters"]["learning_rate"] == 0.05            # 0.0001 barely moves in 3 epochs
    report = subprocess.run([sys.executable, "-m", "zmqflow", "ensemble", "--sweep", str(out), "--json",
                             "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    scored = json.loads(report.stdout)
    assert scored["task"] == "regression" and set(scored["ensemble"]) == {"mean", "median"}
