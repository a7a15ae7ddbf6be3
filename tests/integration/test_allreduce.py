"""--mode allreduce through the launcher: no ps, the workers' ring averages their gradients. Two and three
workers train the MNIST MLP to the sync tests' accuracy target, the replicas end bit-identical, every global
step is one update of every replica, and the chief's checkpoint (variables and Adam's slots) is what the
launcher scores, as `evaluate` and `serve` read any checkpoint."""

import json
import os

import pytest

from zmqflow.common.checkpoints import checkpoint
from zmqflow.jobs.local_cluster import run_training
from tests.integration.test_training import SEED, TARGET

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EPOCHS = 10
ROWS = 4500       # the shipped MNIST sample's train split


@pytest.mark.parametrize("workers", [2, 3])
def test_allreduce_workers_reach_the_sync_target_with_identical_replicas(workers, tmp_path):
    summary = run_training(progress=False, seed=SEED, num_workers=workers, mode="allreduce", epochs=EPOCHS,
                           input="preloaded", log_dir=str(tmp_path))
    assert summary["num_ps"] == 0 and summary["worker_exit_codes"] == [0] * workers
    print(f"\n{workers} all-reduce workers: test accuracy {summary['test_accuracy']}, "
          f"{summary['examples_per_s']} examples/s, global step {summary['global_step']}")
    assert summary["test_accuracy"] >= TARGET, summary
    assert summary["examples"] == EPOCHS * ROWS            # every row trained once per epoch
    results = [json.loads((tmp_path / f"worker{i}-result.json").read_text()) for i in range(workers)]
    assert len({r["variables_sha256"] for r in results}) == 1, results      # bit-identical replicas
    # one global step is one update of every replica: as many as the busiest worker's batches
    assert {r["global_step"] for r in results} == {summary["global_step"]}
    assert summary["global_step"] == max(r["steps"] for r in results) <= EPOCHS * ROWS // (100 * workers) + 1
    saved = checkpoint.Checkpoint(checkpoint.latest_checkpoint(str(tmp_path / "checkpoint")))
    assert saved.step == summary["global_step"] and saved.config["mode"] == "allreduce"
    assert sorted(saved.slot_names("hidden/weights")) == ["m", "v"]
    assert os.path.isdir(summary["log_dir"])
