"""A data spec's train split too large to feed from memory is streamed by reader processes
(`zmqflow reader --data-config`) adopted by the job: the workers train on every row of every epoch."""

import json

import pytest

import zmqflow
from zmqflow.inputs import spec_stream
from tests.integration.test_train_on_data import write_flowers

pytestmark = pytest.mark.integration


def test_a_split_over_the_memory_limit_is_fed_by_readers_and_trains(tmp_path, monkeypatch):
    monkeypatch.setattr(spec_stream, "FEED_FROM_MEMORY_MAX_BYTES", 0)   # every split counts as large
    log_dir = tmp_path / "job"
    with zmqflow.local_cluster(num_ps=1, num_workers=2, data=write_flowers(tmp_path), model="mlp", epochs=20,
                               optimizer={"kind": "adam", "learning_rate": 0.02}, log_dir=str(log_dir)) as job:
        summary = job.wait(timeout=240)
    assert summary["worker_exit_codes"] == [0, 0] and summary["examples"] == 20 * 630   # 70 % of 900 rows
    reader = json.loads((log_dir / "reader-0.json").read_text())        # one file: one reader process
    assert reader["outcome"] == "ok" and reader["instances"] == 20 * 630 and reader["files_done"] == 20
    assert summary["test_split"] == "test" and summary["test_metrics"]["accuracy"] > 0.9, summary
