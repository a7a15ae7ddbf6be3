"""The sweep's feeds and options without processes: the Optuna study on disk (order, resume, pruning,
TPE), device slots, and the usage errors of `zmqflow sweep`, with and without Optuna installed."""

import sys

import pytest
from click.testing import CliRunner

from zmqflow.cli.main import main
from zmqflow.jobs.sweep import leaderboard
from zmqflow.jobs.sweep.runner import device_slots
from zmqflow.jobs.sweep.space import grid, parse_grid
from zmqflow.jobs.sweep.study import STUDY_FILE, PointFeed, StudyError, StudyFeed

pytestmark = pytest.mark.unit

SETTINGS = {"grid": "lr=0.01,0.02,0.03;hidden=8,4x4", "epochs": 2}


def _grid_feed(out, resume=False, settings=SETTINGS, pruner="none"):
    space = parse_grid(SETTINGS["grid"])
    return StudyFeed(str(out), settings, space, {"epochs": 2}, points=grid(space, {"epochs": 2}), pruner=pruner,
                     every_steps=10, startup_trials=1, resume=resume)


def _finish(run, score, status="ok"):
    run.finish({"run_id": run.run_id, "status": status, "hyperparameters": run.point, "validation_metric": "accuracy",
                "validation_score": score})


def test_a_grid_study_gives_the_points_in_order_and_resume_trains_only_what_did_not_finish(tmp_path):
    points = grid(parse_grid(SETTINGS["grid"]), {"epochs": 2})
    feed = _grid_feed(tmp_path)
    assert (tmp_path / STUDY_FILE).exists() and feed.total == 6
    first, second, third = feed.next(), feed.next(), feed.next()
    assert [r.point for r in (first, second, third)] == points[:3]
    assert [r.run_id for r in (first, second, third)] == ["run-001", "run-002", "run-003"]
    assert first.point["hidden"] == [8] and second.point["hidden"] == [4, 4]     # lists come back as lists
    _finish(first, 0.9)
    _finish(second, 0.1, status="failed")
    third.interrupt()                 # Ctrl-C while it trained: it trains again
    fourth = feed.next()              # left RUNNING, as a SIGKILL of the sweep leaves it
    del feed

    resumed = _grid_feed(tmp_path, resume=True)
    assert [e["run_id"] for e in resumed.entries()] == ["run-001", "run-002"]   # finished: never again
    rest = []
    while (run := resumed.next()) is not None:
        rest.append(run)
        _finish(run, 0.5)
    assert sorted(map(str, (r.point for r in rest))) == sorted(map(str, points[2:]))   # the other four, once each
    assert fourth.point in [r.point for r in rest] and third.point in [r.point for r in rest]
    finished = resumed.entries()
    assert len(finished) == 6 and sorted(map(str, (e["hyperparameters"] for e in finished))) == \
        sorted(map(str, points))


def test_resume_refuses_other_settings_or_an_empty_folder(tmp_path):
    with pytest.raises(StudyError, match="no sweep to resume"):
        _grid_feed(tmp_path, resume=True)
    _grid_feed(tmp_path)
    with pytest.raises(StudyError, match=r"other settings \(epochs: 2 then, 3 now\)"):
        _grid_feed(tmp_path, resume=True, settings={**SETTINGS, "epochs": 3})


def test_the_median_pruner_stops_a_run_worse_than_the_finished_ones(tmp_path):
    feed = _grid_feed(tmp_path, pruner="median")
    assert feed.pruning
    good = feed.next()
    assert good.report(10, 0.8) is False          # nothing finished yet: nothing to compare with
    _finish(good, 0.9)
    bad, fine = feed.next(), feed.next()
    assert bad.report(10, 0.1) is True
    assert fine.report(10, 0.85) is False
    _finish(bad, None, status="pruned")
    states = [t.state.name for t in feed.study.get_trials()]
    assert states[:3] == ["COMPLETE", "PRUNED", "RUNNING"]


def test_tpe_asks_points_inside_the_space_until_its_trials_are_taken(tmp_path):
    space = parse_grid("lr=log:1e-4..1e-1;batch_size=20..200;hidden=8,4x4")
    feed = StudyFeed(str(tmp_path), {}, space, {"epochs": 1}, sampler="tpe", trials=3, seed=1)
    runs = [feed.next() for _ in range(3)]
    assert feed.next() is None
    for run in runs:
        assert 1e-4 <= run.point["learning_rate"] <= 1e-1 and 20 <= run.point["batch_size"] <= 200
        assert isinstance(run.point["batch_size"], int) and run.point["hidden"] in ([8], [4, 4])
        assert run.point["epochs"] == 1
        _finish(run, 0.5)
    assert [e["trial"] for e in feed.entries()] == [0, 1, 2]


def test_a_point_feed_gives_each_point_once():
    feed = PointFeed([{"learning_rate": 0.1}, {"learning_rate": 0.2}])
    runs = [feed.next(), feed.next(), feed.next()]
    assert [r.run_id for r in runs[:2]] == ["run-001", "run-002"] and runs[2] is None
    assert not feed.pruning and runs[0].report(10, 0.1) is False


def test_pruned_runs_follow_the_finished_ones_in_the_leaderboard():
    entries = [{"run_id": "run-001", "status": "pruned", "validation_metric": "accuracy", "pruned_at_step": 40,
                "best_value": 0.2},
               {"run_id": "run-002", "status": "failed", "error": "x"},
               {"run_id": "run-003", "status": "ok", "validation_metric": "accuracy", "validation_score": 0.9},
               {"run_id": "run-004", "status": "pruned", "validation_metric": "accuracy", "pruned_at_step": 80,
                "best_value": 0.1}]
    ranked = leaderboard.rank(entries)
    assert [e["run_id"] for e in ranked] == ["run-003", "run-004", "run-001", "run-002"]
    assert [e["rank"] for e in ranked] == [1, None, None, None]


def test_device_slots():
    slots = device_slots("cpu, /cpu:0")
    assert [s["name"] for s in slots] == ["/cpu:0", "/cpu:0"]
    assert all(s["env"] == {"CUDA_VISIBLE_DEVICES": ""} for s in slots)   # a CPU slot hides the GPUs
    for bad, message in (("tpu", "'tpu' is not a device"), ("cpu,,cpu", "comma-separated"),
                         ("/job:ps/gpu:0", "is not a device")):
        with pytest.raises(ValueError, match=message):
            device_slots(bad)


def test_a_gpu_slot_needs_that_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")       # no GPU shown, whatever this machine has
    with pytest.raises(ValueError, match=r"names GPU 1, but this machine shows no GPUs \(zmqflow devices"):
        device_slots("cpu,gpu:1")


def _sweep(args):
    return CliRunner().invoke(main, ["sweep", *args])


@pytest.mark.parametrize("args, message", [
    (["--grid", "lr=0.1", "--sampler", "grid", "--trials", "3"], "a grid trains every point"),
    (["--grid", "lr=0.1", "--sampler", "tpe"], "--sampler tpe needs --trials N"),
    (["--grid", "lr=0.1", "--random", "3", "--sampler", "tpe"], "--random N is --sampler random --trials N"),
    (["--grid", "lr=0.1", "--validate-every-steps", "5"], "add --pruner"),
    (["--grid", "lr=0.1", "--parallel", "2", "--devices", "cpu"], "not both"),
    (["--grid", "lr=0.1", "--devices", "cpu,fpga:0"], "'fpga:0' is not a device"),
])
def test_usage_errors_exit_2_naming_the_option(args, message):
    result = _sweep([*args, "--dry-run"])
    assert result.exit_code == 2 and message in result.output, result.output


def test_random_and_tpe_dry_runs():
    result = _sweep(["--grid", "lr=log:1e-4..1e-1;hidden=8,16", "--sampler", "random", "--trials", "3", "--dry-run"])
    assert result.exit_code == 0 and result.output.count("run-00") == 3, result.output
    shorthand = _sweep(["--grid", "lr=log:1e-4..1e-1;hidden=8,16", "--random", "3", "--dry-run"])
    assert shorthand.exit_code == 0 and shorthand.output == result.output     # the same seeded points
    result = _sweep(["--grid", "lr=log:1e-4..1e-1;hidden=8,16", "--sampler", "tpe", "--trials", "4", "--dry-run"])
    assert result.exit_code == 0 and "4 runs, each point asked of the tpe sampler" in result.output, result.output


def test_without_optuna_the_grid_still_plans_and_optuna_options_name_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "optuna", None)          # as if the sweep extra were not installed
    result = _sweep(["--grid", "lr=0.01,0.1", "--dry-run"])
    assert result.exit_code == 0 and "run-002" in result.output, result.output
    for args in (["--pruner", "median"], ["--sampler", "tpe", "--trials", "3"], ["--resume"]):
        result = _sweep(["--grid", "lr=0.01,0.1", "--out", str(tmp_path), *args])
        assert result.exit_code == 2, result.output
        assert "needs Optuna, which is not installed: pip install 'zmqflow[sweep]'" in result.output, result.output


@pytest.mark.parametrize("pruner", ["successive-halving", "hyperband"])
def test_the_halving_pruners_stop_a_run_that_is_not_the_best_of_its_rung(tmp_path, pruner):
    feed = _grid_feed(tmp_path, pruner=pruner)
    for value in (0.8, 0.82):        # hyperband learns its max resource (20 steps) from the first finished run
        run = feed.next()
        assert run.report(10, value) is False
        run.report(20, value + 0.05)
        _finish(run, value + 0.1)
    worse = feed.next()
    assert worse.report(10, 0.1) is True            # the first rung is one report: 10 steps
