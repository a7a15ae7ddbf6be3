"""`zmqflow sweep` on Optuna for real: a pruner stops bad runs early on two device slots, a sweep killed by
PID resumes without training a finished run twice, and the grid still runs without Optuna."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from zmqflow.cli.main import main

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]


def _sweep(args):
    result = CliRunner().invoke(main, ["sweep", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _processes_of(folder):
    """PIDs of the processes whose command line names `folder` (a sweep's tasks name their run's files)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(folder).encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _most_at_once(runs):
    events = sorted([(r["started_at"], 1) for r in runs] + [(r["ended_at"], -1) for r in runs])
    most = now = 0
    for _, change in events:
        now += change
        most = max(most, now)
    return most


def test_the_median_pruner_stops_the_bad_runs_before_their_last_epoch(tmp_path):
    out = tmp_path / "sweep"
    # the slower learner first: a good run is never compared with a better one that finished before it reported
    output = _sweep(["--grid", "lr=0.003,0.01,1e-6,50", "--epochs", "2", "--devices", "cpu,cpu", "--pruner", "median",
                     "--pruner-startup-trials", "1", "--out", str(out)])
    document = json.loads((out / "leaderboard.json").read_text())
    by_lr = {r["hyperparameters"]["learning_rate"]: r for r in document["runs"]}
    good, bad = [by_lr[0.003], by_lr[0.01]], [by_lr[1e-6], by_lr[50]]
    assert [r["status"] for r in good] == ["ok", "ok"] and [r["status"] for r in bad] == ["pruned", "pruned"], output
    every = document["sweep"]["validate_every_steps"]
    assert every == 4050 // 100          # one epoch of the sweep's training rows at the default batch size
    last_step = good[0]["global_step"]
    for run in bad:
        assert run["pruned_at_step"] == every < last_step                 # stopped after its first epoch of two
        assert run["validation_curve"] == [[every, run["best_value"]]]
        assert run["best_value"] < min(r["validation_curve"][0][1] for r in good)   # worse than both at that step
        assert run["rank"] is None and run["checkpoint"] is None
        assert not (out / "runs" / run["run_id"] / "result.json").exists()   # the job never reached its end
        assert f"{run['run_id']}  PRUNED at step {every}" in output
    for run in good:
        assert [step for step, _ in run["validation_curve"]] == [every, 2 * every, last_step]
        assert run["validation_score"] > 0.7 and run["kept"]
    rows = {r["run_id"]: r for r in csv.DictReader(open(out / "leaderboard.csv"))}
    assert {rows[r["run_id"]]["status"] for r in bad} == {"pruned"}
    assert {rows[r["run_id"]]["pruned_at_step"] for r in bad} == {str(every)}
    assert document["sweep"]["devices"] == ["/cpu:0", "/cpu:0"] and document["sweep"]["pruned"] == 2
    assert all(r["device"] == "/cpu:0" for r in document["runs"]) and _most_at_once(document["runs"]) == 2
    assert not _processes_of(out)          # every run's processes were stopped, the pruned ones too


def _study(out):
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend
    return optuna.load_study(study_name="sweep", storage=JournalStorage(JournalFileBackend(str(out / "study.journal"))))


def test_a_sweep_killed_by_pid_resumes_and_trains_no_run_twice(tmp_path):
    out = tmp_path / "sweep"
    args = ["--grid", "lr=0.01,0.02,0.03", "--epochs", "1", "--devices", "cpu", "--out", str(out)]
    sweep = subprocess.Popen([sys.executable, "-m", "zmqflow", "sweep", *args, "--json"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        deadline, states = time.monotonic() + 200, []
        while time.monotonic() < deadline and not ("COMPLETE" in states and "RUNNING" in states):
            time.sleep(0.2)
            if (out / "study.journal").exists():
                states = [t.state.name for t in _study(out).get_trials()]
        assert "COMPLETE" in states and "RUNNING" in states, states
        os.kill(sweep.pid, signal.SIGTERM)        # mid-way: one run done, one training, one waiting
        sweep.wait(timeout=90)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    assert sweep.returncode != 0
    assert not _processes_of(out)                 # the interrupted run's processes went with the sweep
    before = {t.number: t.user_attrs["entry"] for t in _study(out).get_trials() if "entry" in t.user_attrs}
    assert before and not (out / "leaderboard.json").exists()

    output = _sweep([*args, "--resume"])
    document = json.loads((out / "leaderboard.json").read_text())
    runs = document["runs"]
    assert sorted(r["hyperparameters"]["learning_rate"] for r in runs) == [0.01, 0.02, 0.03], output
    assert all(r["status"] == "ok" for r in runs) and document["sweep"]["resumed"]
    for number, entry in before.items():          # finished before the kill: kept as they were, not trained again
        again = next(r for r in runs if r["trial"] == number)
        assert (again["run_id"], again["started_at"]) == (entry["run_id"], entry["started_at"])
    trials = _study(out).get_trials()
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == 3 and len({t.params["learning_rate"] for t in complete}) == 3
    assert [t.state.name for t in trials].count("FAIL") == 1    # the run the kill interrupted, trained again
    assert not [t for t in trials if t.state.name in ("RUNNING", "WAITING")]


def test_without_optuna_a_grid_sweep_runs_as_before(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "optuna", None)
    out = tmp_path / "sweep"
    _sweep(["--grid", "lr=0.01", "--epochs", "1", "--parallel", "1", "--keep-best", "1", "--out", str(out)])
    run = json.loads((out / "leaderboard.json").read_text())["runs"][0]
    assert run["status"] == "ok" and run["run_id"] == "run-001" and run["validation_accuracy"] > 0.5
    assert not (out / "study.journal").exists()
