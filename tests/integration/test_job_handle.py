"""`zmqflow.Job`: a real job of processes held from Python; its metrics stream while it runs, and stop()
mid-run leaves no process of it behind."""

import pytest

import zmqflow
from tests.integration.test_train_on_data import write_flowers
from tests.support.processes import alive
from zmqflow.common.errors import FailedPreconditionError

pytestmark = pytest.mark.integration

ADAM = {"kind": "adam", "learning_rate": 0.02}


def test_metrics_stream_the_step_loss_and_validation_while_the_job_runs(tmp_path):
    job = zmqflow.Job(num_ps=1, num_workers=2, data=write_flowers(tmp_path), model="mlp", epochs=150, optimizer=ADAM,
                      validate_every_steps=200, summary_every_steps=5, log_dir=str(tmp_path / "logs"))
    with pytest.raises(FailedPreconditionError, match="has not been started"):
        next(job.metrics())
    job.start()                                           # no `with`: start, then stop in finally
    try:
        assert job.running and job.status == "running"
        points = list(job.metrics(interval=0.1))
        summary = job.wait(timeout=120)
    finally:
        job.stop()
    live = [p for p in points if p["running"]]
    steps = [p["global_step"] for p in points]
    assert steps == sorted(steps) and len(set(s for s in steps if s > 0)) >= 3, steps   # seen increasing
    assert not points[-1]["running"] and points[-1]["global_step"] == summary["global_step"]
    assert points[-1]["examples"] == pytest.approx(150 * 630, rel=0.02)        # 70 % of 900 rows, 150 epochs
    assert any(p["examples_per_s"] > 0 for p in live) and any(p["loss"] is not None for p in live)
    assert points[-1]["validation"]["accuracy"] > 0.8 and points[-1]["validation"]["step"] > 0
    assert summary["test_metrics"]["accuracy"] > 0.8 and job.status == "finished" and not job.running
    assert not [pid for pid in job.pids() if alive(pid)]


def test_stop_mid_run_leaves_no_process_behind(tmp_path):
    with zmqflow.local_cluster(num_ps=2, num_workers=2, data=write_flowers(tmp_path), model="mlp", epochs=5000,
                               log_dir=str(tmp_path / "logs")) as job:
        pids = job.pids()
        assert len(pids) >= 5 and all(alive(pid) for pid in pids)        # broker, input, 2 ps, 2 workers
        for point in job.metrics(interval=0.1):
            if point["global_step"] > 30:
                break
        assert point["running"] and job.running
        job.stop()
        assert job.status == "stopped" and not job.running
        assert not [pid for pid in pids if alive(pid)]
    with pytest.raises(FailedPreconditionError, match="started already"):
        job.start()
