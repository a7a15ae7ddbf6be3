"""An all-reduce job (--mode allreduce, no ps) whose worker is SIGKILLed mid-run: the ring notices within
--lost-after-secs and, by --lost-policy, every worker stops naming the lost one, or the chief re-forms the ring
without it and training finishes with identical replicas. Real broker, reader and three workers."""

import json
import time

import pytest

from zmqflow.inputs.datasets import mnist_split, write_record_shards
from tests.support import wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slow]

LOST_AFTER = 2.0


def start_ring(processes, tmp_path, policy, epochs):
    """Broker, one reader of the MNIST shards and three all-reduce workers; returns the workers once the
    chief logged 20 steps (a summary line every 10)."""
    (x, y), _ = mnist_split()
    write_record_shards(x, y, str(tmp_path / "shards"))
    broker = processes.service("zmqflow.services.broker")
    processes.process("zmqflow.services.reader", ["--broker", broker.endpoint, "--preset", "mnist-shards", "--files",
                                                  str(tmp_path / "shards" / "*.bin"), "--num-epochs", str(epochs)])
    common = ["--broker", broker.endpoint, "--num-workers", "3", "--mode", "allreduce", "--backend", "numpy",
              "--log-every", "50", "--lost-after-secs", str(LOST_AFTER), "--lost-policy", policy,
              "--optimizer", json.dumps({"kind": "adam", "learning_rate": 0.004})]
    summaries = tmp_path / "worker0-summaries.jsonl"
    chief = processes.service("zmqflow.services.worker", [*common, "--task-index", "0", "--json-out",
                                                         str(tmp_path / "worker0.json"), "--config",
                                                         _config(tmp_path, summaries)])
    others = [processes.process("zmqflow.services.worker", [*common, "--task-index", str(i), "--chief", chief.endpoint,
                                                            "--bind", "tcp://127.0.0.1:*", "--json-out",
                                                            str(tmp_path / f"worker{i}.json")]) for i in (1, 2)]
    wait_for(lambda: summaries.exists() and summaries.read_text().count("\n") >= 2, 60, "20 all-reduce steps")
    return [chief, *others]


def _config(tmp_path, summaries):
    """The chief's --config: a JSON-lines summary every 10 steps (a launcher's option, no flag of its own)."""
    path = tmp_path / "chief.json"
    path.write_text(json.dumps({"summaries": str(summaries), "summary-every-steps": 10}))
    return str(path)


def test_abort_policy_stops_every_worker_naming_the_lost_one(processes, tmp_path):
    chief, first, second = start_ring(processes, tmp_path, "abort", epochs=40)
    second.kill()
    killed = time.monotonic()
    wait_for(lambda: not chief.alive() and not first.alive(), 15, "the other workers to stop")
    took = time.monotonic() - killed
    print(f"\nthe chief stopped {took:.1f} s after worker 2 was killed (--lost-after-secs {LOST_AFTER:g}), "
          f"exit {chief.returncode}")
    assert took <= LOST_AFTER + 3.0
    assert chief.returncode == 3 and first.returncode == 3     # the peer-lost exit code
    assert "worker 2 was lost" in chief.log() and "worker 2 was lost" in first.log()


def test_continue_policy_reforms_the_ring_and_training_finishes(processes, tmp_path):
    chief, first, second = start_ring(processes, tmp_path, "continue", epochs=10)
    second.kill()
    wait_for(lambda: not chief.alive() and not first.alive(), 90, "the two workers left to finish")
    assert chief.returncode == 0 and first.returncode == 0, chief.log()[-2000:]
    results = [json.loads((tmp_path / f"worker{i}.json").read_text()) for i in (0, 1)]
    assert results[0]["lost_workers"] == [2] and results[0]["ring_reformed"] == 1
    assert results[1]["ring_reformed"] == 1
    assert results[0]["variables_sha256"] == results[1]["variables_sha256"]    # the replicas stayed identical
    assert results[0]["global_step"] == results[1]["global_step"]
    assert "lost; the ring goes on without it" in chief.log()


def test_the_launcher_lets_a_ring_that_goes_on_finish_the_job(tmp_path):
    """`zmqflow train --mode allreduce --lost-policy continue`: a killed worker does not fail the job."""
    from zmqflow.jobs.local_cluster import LocalCluster
    with LocalCluster(mode="allreduce", num_workers=3, lost_policy="continue", lost_after_secs=LOST_AFTER, epochs=20,
                      input="preloaded", seed=0, log_dir=str(tmp_path)) as cluster:
        cluster.start()
        summaries = tmp_path / "worker0-summaries.jsonl"
        wait_for(lambda: summaries.exists() and summaries.read_text().count("\n") >= 2, 60, "20 all-reduce steps")
        cluster.workers[2].kill()
        summary = cluster.wait(timeout=90)
    assert summary["worker_exit_codes"][:2] == [0, 0] and summary["worker_exit_codes"][2] != 0
    assert summary["test_accuracy"] > 0.5, summary     # trained on by the two left
    chief = json.loads((tmp_path / "worker0-result.json").read_text())
    assert chief["lost_workers"] == [2] and chief["ring_reformed"] == 1
